// The device memory a transformer pass keeps for its backward, per token: what train.backward: auto
// weighs when it chooses between one pass over a micro-step's tasks (their activations alive at
// once) and a pass per task (one task's alive at a time). Counted from the tensors the model's
// autograd functions save (daemon/models/transformer.cpp and daemon/ops/), not measured: an
// estimate that docs/BENCHMARKS.md holds against the allocator's figures.
#pragma once

#include <cstdint>
#include <string>

#include "config/job.hpp"

namespace thetad::daemon {

struct ActivationEstimate {
  int64_t bytes_per_token = 0;  // 0: not a model whose passes this counts (not the transformer)
  std::string parts;            // "22 layers x (6 d_model + 2 kv + 3 d_ff + 7 r) x 2 B + ..." in words
};

// Per token of a pass: each layer's saved tensors (norm inputs and outputs, q, k, v, the attention's
// output, the feed-forward's inputs, the adapters' x A^T), the output layer's saved gradient of the
// logits and the final norm's input, in the compute dtype (2 B with precision: bf16, else 4).
// offload.activations leaves out the feed-forward activation's input (it waits in host memory).
ActivationEstimate transformer_activations(const config::Job& job);

// Where train.backward: auto fuses: the joint pass's activations (`joint_bytes`) fit the device's
// free memory (`free_bytes`, measured once the model, its adapters and the engine's buffers are
// allocated) with a tenth of the device (`total_bytes`) left over for the workspace, the first
// step's Adam moments and the allocator's rounding.
bool joint_pass_fits(int64_t joint_bytes, int64_t free_bytes, int64_t total_bytes);

}  // namespace thetad::daemon
