// fused_cross_entropy (see fused_cross_entropy.hpp): a custom autograd function.
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
      // A copy even where the logits are float32 already: the chunk is overwritten below.
      const torch::Tensor l = logits.narrow(0, r, n).to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
      const torch::Tensor t = targets.narrow(0, r, n).unsqueeze(1);
      const torch::Tensor lse = l.logsumexp(1, /*keepdim=*/true);
      per_row.narrow(0, r, n).copy_((lse - l.gather(1, t)).squeeze(1));
      // (softmax - onehot) / rows, in place of the chunk's logits.
      l.sub_(lse).exp_();
      l.scatter_add_(1, t, torch::full({n, 1}, -1.0, l.options()));
      l.mul_(inv_rows);
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

}  // namespace

torch::Tensor fused_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, int64_t rows_per_chunk) {
  return FusedCrossEntropy::apply(logits, targets, rows_per_chunk);
}

}  // namespace thetad::daemon
