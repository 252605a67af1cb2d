// fused_cross_entropy and linear_cross_entropy (see fused_cross_entropy.hpp): custom autograd
// functions.
#include "daemon/models/fused_cross_entropy.hpp"

#include <algorithm>

namespace thetad::daemon {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows per chunk: a chunk's float32 logits and probabilities stay within ~64 MiB each.
int64_t chunk_rows(int64_t classes) {
  constexpr int64_t kChunkFloats = int64_t(16) << 20;
  return std::max<int64_t>(1, kChunkFloats / std::max<int64_t>(1, classes));
}

// One chunk of float32 logits (overwritten): each row's loss into `per_row`, and the logits
// become (softmax - onehot) * inv_rows, d loss / d logits of the mean over all rows.
void loss_and_gradient(torch::Tensor& l, const torch::Tensor& targets, torch::Tensor per_row, double inv_rows) {
  const torch::Tensor t = targets.unsqueeze(1);
  const torch::Tensor lse = l.logsumexp(1, /*keepdim=*/true);
  per_row.copy_((lse - l.gather(1, t)).squeeze(1));
  l.sub_(lse).exp_();
  l.scatter_add_(1, t, torch::full({l.size(0), 1}, -1.0, l.options()));
  l.mul_(inv_rows);
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
      // A copy even where the logits are float32 already: the chunk is overwritten.
      torch::Tensor l = logits.narrow(0, r, n).to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
      loss_and_gradient(l, targets.narrow(0, r, n), per_row.narrow(0, r, n), inv_rows);
      grad.narrow(0, r, n).copy_(l);
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
      // The unfused gradient is the float32 one rounded to the logits' dtype, then multiplied
      // through the weight in that dtype: so here.
      torch::Tensor l = logits.scalar_type() == torch::kFloat32 ? logits : logits.to(torch::kFloat32);
      loss_and_gradient(l, targets.narrow(0, r, n), per_row.narrow(0, r, n), inv_rows);
      grad_hidden.narrow(0, r, n).copy_(torch::matmul(l.to(logits.scalar_type()), w));
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
