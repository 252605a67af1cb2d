// The Llama layer's SwiGLU and its rotary split as autograd nodes over the project's own kernels
// (daemon/models/llama_kernels.hpp): bf16 tensors on a GPU of a build that has them. The
// transformer uses them where fused_kernels_for(x) holds and LibTorch's operators elsewhere (the
// CPU, float32): the same function, within bf16's rounding (the kernels round once where the
// operators round after each operation).
#pragma once

#include <torch/torch.h>

#include <array>

#include "daemon/models/rotary.hpp"
#include "daemon/models/trunk_layer.hpp"

namespace thetad::daemon {

// Whether this build's kernels compute on x: a contiguous bf16 CUDA tensor.
bool fused_kernels_for(const torch::Tensor& x);

// silu(gate) * up from the joined gate/up GEMM's output gu [rows, seq, 2 ff]; backward writes the
// joined gradient at once (no concatenation of two halves). `layer` and `stash` as for
// ffn_activation (offload.activations keeps gu on the host).
torch::Tensor swiglu_joined(const torch::Tensor& gu, int layer, ActivationStash* stash);

// q [rows, seq, heads head], k and v [rows, seq, kv_heads head], contiguous, q and k rotated by
// `rotary`, from the joined q/k/v GEMM's output qkv [rows, seq, (heads + 2 kv_heads) head].
std::array<torch::Tensor, 3> rotary_split(const torch::Tensor& qkv, const RotaryTables& rotary, int64_t heads,
                                          int64_t kv_heads, int64_t head);

}  // namespace thetad::daemon
