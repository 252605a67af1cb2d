// fused_cross_entropy and linear_cross_entropy (see fused_cross_entropy.hpp): custom autograd
// functions.
#include "daemon/models/fused_cross_entropy.hpp"

#include <algorithm>

namespace thetad::daemon {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows per chunk: a chunk's float32 logits and probabilities stay within ~64 MiB each, in a
// whole number of the GEMMs' row tiles. A chunk of 524 rows (32,000 classes) runs 5 tiles of 128
// rows, the last holding 12: both of a chunk's GEMMs took 13.4 ms per 4,096 rows where 512-row
// chunks take 11.0 and the unfused pair 10.5 (H100, float32; bench/gpu/ce_chunks.py). Chunks of
// 256 rows hold 63 MiB less at the loss, but the LoRA step's peak is elsewhere (it did not move).
int64_t chunk_rows(int64_t classes) {
  constexpr int64_t kChunkFloats = int64_t(16) << 20;
  const int64_t fit = std::max<int64_t>(1, kChunkFloats / std::max<int64_t>(1, classes));
  for (int64_t tile : {128, 32, 8})
    if (fit >= tile) return fit / tile * tile;
  return fit;
}

// One chunk of float32 logits in: each row's loss into `per_row`, and softmax - onehot out (not
// yet divided by the rows: the caller folds that into its next pass). One log_softmax kernel,
// where logsumexp makes four passes and a temporary of the chunk's size; exp in place.
torch::Tensor loss_and_gradient(const torch::Tensor& logits, const torch::Tensor& targets, torch::Tensor per_row) {
  const torch::Tensor t = targets.unsqueeze(1);
  torch::Tensor l = torch::log_softmax(logits, 1);
  per_row.copy_(l.gather(1, t).squeeze(1).neg_());
  l.exp_();
  l.scatter_add_(1, t, torch::full({l.size(0), 1}, -1.0, l.options()));
  return l;
}

// out = l / rows in out's dtype, one pass (the multiplication in float32, then the cast).
void scale_into(torch::Tensor out, const torch::Tensor& l, double inv_rows) {
  torch::mul_out(out, l, torch::scalar_tensor(inv_rows, torch::kFloat64));
}

struct FusedCrossEntropy : torch::autograd::Function<FusedCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits, const torch::Tensor& targets,
                               int64_t rows_per_chunk) {
    const int64_t rows = logits.size(0), classes = logits.size(1);
    torch::Tensor per_row = torch::empty({rows}, logits.options().dtype(torch::kFloat32));
    // The gradient in the logits' dtype: what backward of the unfused loss hands to the matmul
    // that made the logits (its float32 gradient cast back), never held in float32 here.
    torch::Tensor grad = torch::empty_like(logits, torch::MemoryFormat::Contiguous);
    const double inv_rows = 1.0 / double(rows);
    const int64_t step = rows_per_chunk > 0 ? rows_per_chunk : chunk_rows(classes);
    for (int64_t r = 0; r < rows; r += step) {
      const int64_t n = std::min(step, rows - r);
      const torch::Tensor chunk = logits.narrow(0, r, n).to(torch::kFloat32);
      scale_into(grad.narrow(0, r, n), loss_and_gradient(chunk, targets.narrow(0, r, n), per_row.narrow(0, r, n)),
                 inv_rows);
    }
    ctx->save_for_backward({grad});
    return per_row.mean();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    torch::Tensor grad = ctx->get_saved_variables()[0];
    // Scaled in place (in float32 arithmetic, a 0-dim factor keeps the dtype): this function's
    // backward runs once (thetad never retains the graph).
    grad.mul_(grad_out[0]);
    return {grad, torch::Tensor(), torch::Tensor()};
  }
};

struct LinearCrossEntropy : torch::autograd::Function<LinearCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden, const torch::Tensor& weight,
                               const torch::Tensor& targets, int64_t rows_per_chunk) {
    const int64_t rows = hidden.size(0), classes = weight.size(0);
    torch::Tensor per_row = torch::empty({rows}, hidden.options().dtype(torch::kFloat32));
    torch::Tensor grad_hidden = torch::empty_like(hidden, torch::MemoryFormat::Contiguous);
    const double inv_rows = 1.0 / double(rows);
    const int64_t step = rows_per_chunk > 0 ? rows_per_chunk : chunk_rows(classes);
    torch::Tensor w = weight;  // cast once to the logits' dtype (autocast would cast it per matmul)
    for (int64_t r = 0; r < rows; r += step) {
      const int64_t n = std::min(step, rows - r);
      const torch::Tensor logits = torch::matmul(hidden.narrow(0, r, n), w.t());
      if (w.scalar_type() != logits.scalar_type()) w = weight.to(logits.scalar_type());
      const torch::Tensor l =
          loss_and_gradient(logits.to(torch::kFloat32), targets.narrow(0, r, n), per_row.narrow(0, r, n));
      torch::Tensor out = grad_hidden.narrow(0, r, n);
      if (logits.scalar_type() == torch::kFloat32 && out.scalar_type() == torch::kFloat32) {
        // 1/rows as the GEMM's alpha and its product straight into the output rows (beta 0: their
        // old contents are ignored): no pass over the chunk to scale it, no copy.
        torch::addmm_out(out, out, l, w, /*beta=*/0, /*alpha=*/inv_rows);
      } else {
        // The unfused gradient is the float32 one rounded to the logits' dtype, then multiplied
        // through the weight in that dtype: so here.
        torch::Tensor g = torch::empty(l.sizes(), l.options().dtype(logits.scalar_type()));
        scale_into(g, l, inv_rows);
        out.copy_(torch::matmul(g, w));
      }
    }
    ctx->save_for_backward({grad_hidden});
    return per_row.mean();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    torch::Tensor grad = ctx->get_saved_variables()[0];
    grad.mul_(grad_out[0]);  // once: thetad never retains the graph
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                   const torch::Tensor& targets, int64_t rows_per_chunk) {
  if (weight.requires_grad()) return fused_cross_entropy(torch::matmul(hidden, weight.t()), targets, rows_per_chunk);
  return LinearCrossEntropy::apply(hidden, weight, targets, rows_per_chunk);
}

torch::Tensor fused_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, int64_t rows_per_chunk) {
  return FusedCrossEntropy::apply(logits, targets, rows_per_chunk);
}

}  // namespace thetad::daemon
