// The Llama layer's residual add with RMSNorm, its SwiGLU and its rotary split as autograd nodes over the project's own kernels
// (daemon/ops/llama_kernels.hpp): bf16 tensors on a GPU of a build that has them. The
// transformer uses them where fused_kernels_for(x) holds and LibTorch's operators elsewhere (the
// CPU, float32): the same function, within bf16's rounding (the kernels round once where the
// operators round after each operation).
#pragma once

#include <torch/torch.h>

#include <array>
#include <utility>

#include "daemon/ops/rotary.hpp"
#include "daemon/ops/trunk_layer.hpp"

namespace thetad::daemon {

// Whether this build's kernels compute on x: a contiguous bf16 CUDA tensor.
bool fused_kernels_for(const torch::Tensor& x);

// Whether residual_rms_norm computes on (h, o, w): this build has the kernels, h is a contiguous
// float32 CUDA tensor, autocast computes in bf16 there, o is undefined or a contiguous bf16
// tensor of h's shape, and w takes no gradient (a frozen base's norm).
bool residual_rms_norm_fits(const torch::Tensor& h, const torch::Tensor& o, const torch::Tensor& w);

// {h + o, bf16(rms_norm(h + o) * w)} in one kernel (backward: one kernel that writes the sum's
// float32 gradient and its bf16 copy for o), where the operators take an add, the norm, and a
// cast each way. o undefined: {h, the norm of h}.
std::pair<torch::Tensor, torch::Tensor> residual_rms_norm(const torch::Tensor& h, const torch::Tensor& o,
                                                          const torch::Tensor& w, double eps);

// silu(gate) * up from the joined gate/up GEMM's output gu [rows, seq, 2 ff]; backward writes the
// joined gradient at once (no concatenation of two halves). `layer` and `stash` as for
// ffn_activation (offload.activations keeps gu on the host).
torch::Tensor swiglu_joined(const torch::Tensor& gu, int layer, ActivationStash* stash);

// q [rows, seq, heads head], k and v [rows, seq, kv_heads head], contiguous, q and k rotated by
// `rotary`, from the joined q/k/v GEMM's output qkv [rows, seq, (heads + 2 kv_heads) head].
std::array<torch::Tensor, 3> rotary_split(const torch::Tensor& qkv, const RotaryTables& rotary, int64_t heads,
                                          int64_t kv_heads, int64_t head);

}  // namespace thetad::daemon
