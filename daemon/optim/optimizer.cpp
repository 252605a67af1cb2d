// Tensor implementation of the per-group optimizer (see optimizer.hpp). On host tensors the
// fused, vectorized CPU Adam of offload/ does the work, so offloaded and resident groups step
// with the same kernel (bitwise-equal results on the CPU).
#include "daemon/optim/optimizer.hpp"

#include <torch/version.h>

#include <cmath>
#include <cstring>

#if THETAD_TORCH_CUDA && THETAD_MODEL_KERNELS
#include <c10/cuda/CUDAStream.h>

#include "daemon/optim/adam_kernels.hpp"
#endif

#include "common/clip.hpp"


namespace thetad::daemon {

offload::AdamHyper to_hyper(const AdamSettings& s) {
  offload::AdamHyper h;
  h.lr = s.lr;
  h.beta1 = s.beta1;
  h.beta2 = s.beta2;
  h.eps = s.eps;
  h.weight_decay = s.weight_decay;
  h.decoupled = s.kind == config::OptimizerKind::AdamW;
  h.step = s.step;
  h.grad_scale = s.grad_scale;
  return h;
}

double clip_scale(const std::vector<at::Tensor>& grads, double clip_norm) {
  if (clip_norm <= 0) return 1.0;
  double sq = 0;
  for (const auto& g : grads) sq += g.to(at::kDouble).pow(2).sum().item<double>();
  const double norm = std::sqrt(sq);
  return clip_factor(norm, clip_norm);
}

namespace {

#if THETAD_TORCH_CUDA && THETAD_MODEL_KERNELS
// The group's Adam or AdamW step by the project's kernel (daemon/optim/adam_kernels.hpp): one
// launch over every tensor. False (nothing done) where an operand is not contiguous float32.
bool adam_by_kernel(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                    std::vector<at::Tensor>& exp_avg, std::vector<at::Tensor>& exp_avg_sq, const AdamSettings& s) {
  const auto plain = [](const at::Tensor& t) { return t.scalar_type() == at::kFloat && t.is_contiguous(); };
  std::vector<kernels::AdamTensor> table;
  int64_t chunks = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!plain(params[i]) || !plain(grads[i]) || !plain(exp_avg[i]) || !plain(exp_avg_sq[i])) return false;
    const int64_t n = params[i].numel();
    if (n == 0) continue;
    table.push_back({params[i].data_ptr<float>(), grads[i].data_ptr<float>(), exp_avg[i].data_ptr<float>(),
                     exp_avg_sq[i].data_ptr<float>(), n, chunks});
    chunks += (n + kernels::kAdamChunk - 1) / kernels::kAdamChunk;
  }
  if (table.empty()) return true;
  // The table reaches the device through pinned memory, queued on the stream that then reads it
  // (the caching host allocator keeps the block until that copy is done).
  const int64_t bytes = static_cast<int64_t>(table.size() * sizeof(kernels::AdamTensor));
  at::Tensor host = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  std::memcpy(host.data_ptr(), table.data(), static_cast<size_t>(bytes));
  const at::Tensor device = host.to(params[0].device(), /*non_blocking=*/true);
  const double bias1 = 1.0 - std::pow(s.beta1, double(s.step)), bias2 = 1.0 - std::pow(s.beta2, double(s.step));
  const kernels::AdamArithmetic a{static_cast<float>(s.lr),           static_cast<float>(s.beta1),
                                  static_cast<float>(s.beta2),        static_cast<float>(s.eps),
                                  static_cast<float>(s.weight_decay), static_cast<float>(s.grad_scale),
                                  static_cast<float>(s.lr / bias1),   static_cast<float>(std::sqrt(bias2)),
                                  s.kind == config::OptimizerKind::AdamW};
  kernels::adam_step(reinterpret_cast<const kernels::AdamTensor*>(device.data_ptr()), static_cast<int>(table.size()),
                     chunks, a, c10::cuda::getCurrentCUDAStream(params[0].device().index()).stream());
  return true;
}
#endif

}  // namespace

void adam_group(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                std::vector<at::Tensor>& exp_avg, std::vector<at::Tensor>& exp_avg_sq,
                const AdamSettings& s) {
  if (s.kind == config::OptimizerKind::Sgd) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (s.weight_decay != 0) params[i].mul_(1.0 - s.lr * s.weight_decay);
      params[i].add_(grads[i], -s.lr * s.grad_scale);
    }
    return;
  }
  const bool decoupled = s.kind == config::OptimizerKind::AdamW;
#if TORCH_VERSION_MAJOR >= 2
  // GPUs: one fused multi-tensor kernel for the group (PyTorch >= 2), instead of ~8 passes; the
  // project's own where the build has it (one launch that fills the GPU).
  if (!params.empty() && params[0].is_cuda()) {
#if THETAD_TORCH_CUDA && THETAD_MODEL_KERNELS
    if (adam_by_kernel(params, grads, exp_avg, exp_avg_sq, s)) return;
#endif
    if (s.grad_scale != 1.0) at::_foreach_mul_(grads, s.grad_scale);
    // One step count read by every tensor (the kernel only reads it): a tensor of its own per
    // parameter would be an allocation and a fill kernel each, thousands per step with many
    // adapters, enough to fill the launch queue and stall the host behind the device.
    const at::Tensor step = at::full({}, static_cast<double>(s.step), params[0].options().dtype(at::kFloat));
    const std::vector<at::Tensor> steps(params.size(), step);
    if (decoupled)
      at::_fused_adamw_(params, grads, exp_avg, exp_avg_sq, {}, steps, s.lr, s.beta1, s.beta2,
                        s.weight_decay, s.eps, /*amsgrad=*/false, /*maximize=*/false);
    else
      at::_fused_adam_(params, grads, exp_avg, exp_avg_sq, {}, steps, s.lr, s.beta1, s.beta2,
                       s.weight_decay, s.eps, /*amsgrad=*/false, /*maximize=*/false);
    return;
  }
#endif
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor& p = params[i];
    if (p.device().is_cpu() && p.is_contiguous() && grads[i].is_contiguous()) {
      const offload::AdamHyper h = to_hyper(s);
      offload::adam_step(p.data_ptr<float>(), grads[i].data_ptr<float>(),
                         exp_avg[i].data_ptr<float>(), exp_avg_sq[i].data_ptr<float>(),
                         static_cast<size_t>(p.numel()), h);
      continue;
    }
    // Device tensors: the same formulas with tensor ops (torch.optim's single-tensor path).
    at::Tensor g = s.grad_scale != 1.0 ? grads[i] * s.grad_scale : grads[i];
    if (decoupled) {
      p.mul_(1.0 - s.lr * s.weight_decay);
    } else if (s.weight_decay != 0) {
      g = g.add(p, s.weight_decay);
    }
    const double bc1 = 1.0 - std::pow(s.beta1, double(s.step));
    const double bc2 = 1.0 - std::pow(s.beta2, double(s.step));
    exp_avg[i].mul_(s.beta1).add_(g, 1.0 - s.beta1);
    exp_avg_sq[i].mul_(s.beta2).addcmul_(g, g, 1.0 - s.beta2);
    at::Tensor denom = (exp_avg_sq[i].sqrt() / std::sqrt(bc2)).add_(s.eps);
    p.addcdiv_(exp_avg[i], denom, -s.lr / bc1);
  }
}

}  // namespace thetad::daemon
