// Per-group AdamW/Adam/SGD on LibTorch tensors, with per-group gradient clipping. Shared by the
// worker and the single-process reference of the equivalence tests, so both do the same math.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "config/job.hpp"
#include "offload/cpu_adam.hpp"

namespace thetad::daemon {

struct AdamSettings {
  config::OptimizerKind kind = config::OptimizerKind::AdamW;
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  int64_t step = 1;         // the group's own step count, 1-based (lazy: only steps it was used)
  double grad_scale = 1.0;  // from clipping
};

// A step's operands as tensors: parameters, their gradients and both moments, one of each per
// parameter (views of wherever they live: a device cache line, a pooled gradient buffer).
struct AdamOperands {
  std::vector<at::Tensor> params, grads, exp_avg, exp_avg_sq;
};

// The same settings for the fused CPU kernel of offload/ (host store and host tensors).
offload::AdamHyper to_hyper(const AdamSettings& s);

// Factor that brings the group's gradient norm down to clip_norm (1 when clip_norm <= 0 or the
// norm is already below it).
double clip_scale(const std::vector<at::Tensor>& grads, double clip_norm);

// One optimizer step over a group's parameters, in place, matching torch.optim.AdamW/Adam.
void adam_group(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                std::vector<at::Tensor>& exp_avg, std::vector<at::Tensor>& exp_avg_sq,
                const AdamSettings& s);

}  // namespace thetad::daemon
