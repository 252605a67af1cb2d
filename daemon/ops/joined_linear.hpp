// The transformer's linear layers as few, large GEMMs: a frozen base's matrices that read the
// same input (q, k and v; gate and up) joined into one matrix, and the tasks' LoRA adapters on
// those matrices joined to match, so that a layer reads its input once, writes one output and,
// in backward, one gradient of its input, and the adapters' products land in the base GEMM's
// output (and their gradients in the base's) without a pass of their own.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "daemon/ops/frozen_weight.hpp"

namespace thetad::daemon {

// The parts' rows (matrices [out_i, in], or vectors [out_i]) concatenated into one tensor, each
// part then re-pointed at its own rows of it (set_data: every holder of the parameter sees the
// view, the values are unchanged, no second copy stays). For parameters nothing updates (a
// frozen base); an empty tensor where the parts cannot be joined (devices, dtypes or trailing
// sizes differ, or a part is not plain contiguous memory).
torch::Tensor join_rows(const std::vector<torch::Tensor>& parts);

// Whether the parts are still consecutive row blocks of `joined` (join_rows's views): a
// parameter re-pointed since (a checkpoint's values loaded by set_data) makes it false.
bool joined_in(const torch::Tensor& joined, const std::vector<torch::Tensor>& parts);

// The A matrices [n, r, in] of a joined matrix's adapted parts, stacked as one [n, m r, in].
torch::Tensor join_lora_a(const std::vector<torch::Tensor>& as);

// The B matrices [n, out_i, r] of a joined matrix's parts (undefined: the part is not adapted)
// as one [n, sum out_i, m r]: the i-th adapted part's rows hold its B in that part's own r
// columns, zeros elsewhere, so (x A^T) B^T gives every part its own adapter's product.
torch::Tensor join_lora_b(const std::vector<torch::Tensor>& bs, const std::vector<int64_t>& outs);

// x w^T (+ bias) + scale (x a^T) b^T, where x [rows, ..., in] holds n tasks' shares of rows in
// order (`rows`: each task's) and a [n, R, in], b [n, out, R] are their adapters; computed in
// autocast's dtype where it is on. Equal shares take batched GEMMs over all tasks, unequal ones
// a GEMM pair per task. The adapters' product is written first and the base GEMM adds into it
// (beta = 1; with a bias, the base first and the product added by its GEMM), and backward makes
// x's gradient the same way: no pass over the output or the gradient of their own.
torch::Tensor lora_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                          const torch::Tensor& a, const torch::Tensor& b, double scale, const std::vector<int64_t>& rows);
// The same over a base matrix the model does not hold (frozen_weight.hpp: nf4, a streamed layer):
// its values asked of their source just before the base GEMM of forward and again before that of
// x's gradient in backward, let go once each GEMM is queued, never kept.
torch::Tensor lora_linear(const torch::Tensor& x, const FrozenWeight& w, const torch::Tensor& bias,
                          const torch::Tensor& a, const torch::Tensor& b, double scale, const std::vector<int64_t>& rows);
// x w^T (+ bias) of such a matrix without adapters, asked for as lora_linear's.
torch::Tensor frozen_linear(const torch::Tensor& x, const FrozenWeight& w, const torch::Tensor& bias);

}  // namespace thetad::daemon
