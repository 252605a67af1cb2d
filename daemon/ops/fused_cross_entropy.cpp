// fused_cross_entropy and linear_cross_entropy (see fused_cross_entropy.hpp): custom autograd
// functions.
#include "daemon/ops/fused_cross_entropy.hpp"

#include <algorithm>
#include <initializer_list>

#if THETAD_TORCH_CUDA && THETAD_MODEL_KERNELS
#include <c10/cuda/CUDAStream.h>

#include "daemon/ops/cross_entropy_kernels.hpp"
#endif

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

// loss_and_gradient and the scaling into `grad` as one kernel, where the logits are a contiguous
// bf16 chunk on a GPU of a build that has it (grad may be the logits: overwritten in place);
// false elsewhere, nothing done. The same function: the kernel computes in float32 and rounds the
// gradient once, as scale_into does.
bool softmax_gradient_kernel(const torch::Tensor& logits, const torch::Tensor& targets, torch::Tensor per_row,
                             torch::Tensor grad, double inv_rows) {
#if THETAD_TORCH_CUDA && THETAD_MODEL_KERNELS
  if (!logits.is_cuda() || logits.scalar_type() != torch::kBFloat16 || !logits.is_contiguous() ||
      grad.scalar_type() != torch::kBFloat16 || !grad.is_contiguous() || !per_row.is_contiguous())
    return false;
  const torch::Tensor t = targets.to(torch::kInt64).contiguous();
  kernels::softmax_gradient(reinterpret_cast<const uint16_t*>(logits.data_ptr()), t.data_ptr<int64_t>(),
                            per_row.data_ptr<float>(), reinterpret_cast<uint16_t*>(grad.data_ptr()), logits.size(0),
                            logits.size(1), static_cast<float>(inv_rows),
                            c10::cuda::getCurrentCUDAStream(logits.device().index()).stream());
  return true;
#else
  (void)logits, (void)targets, (void)per_row, (void)grad, (void)inv_rows;
  return false;
#endif
}

// Masked targets (below 0): the rows' weights [rows, 1] as float32, valid / counted rows, and the
// mean loss over the counted rows (0 where none is counted), on the device. `per_row` holds
// each row's loss (a masked row's is garbage, gathered at target 0: zeroed here).
struct MaskedRows {
  torch::Tensor safe;    // the targets with -1 replaced by 0 (what gather and scatter read)
  torch::Tensor weight;  // [rows, 1]: 1 / counted for a counted row, 0 for a masked one
  torch::Tensor valid;   // [rows] bool
};

MaskedRows masked_rows(const torch::Tensor& targets) {
  MaskedRows m;
  m.valid = targets.ge(0);
  m.safe = targets.clamp_min(0);
  const torch::Tensor counted = m.valid.sum().clamp_min(1).to(torch::kFloat32);
  m.weight = (m.valid.to(torch::kFloat32) / counted).unsqueeze(1);
  return m;
}

torch::Tensor masked_mean(const torch::Tensor& per_row, const MaskedRows& m) {
  return (per_row * m.weight.squeeze(1)).sum();
}

// The loss alone, chunk by chunk (nothing needs a gradient): each chunk's logits in float32,
// log_softmax, the targets' entries; mean over the rows, or the counted rows where masked.
template <typename Logits>
torch::Tensor loss_only(int64_t rows, int64_t classes, const torch::Tensor& targets, int64_t rows_per_chunk, bool masked,
                        const torch::TensorOptions& opts, Logits&& logits_of) {
  const MaskedRows m = masked ? masked_rows(targets) : MaskedRows{targets, {}, {}};
  torch::Tensor per_row = torch::empty({rows}, opts.dtype(torch::kFloat32));
  const int64_t step = rows_per_chunk > 0 ? rows_per_chunk : chunk_rows(classes);
  for (int64_t r = 0; r < rows; r += step) {
    const int64_t n = std::min(step, rows - r);
    const torch::Tensor l = torch::log_softmax(logits_of(r, n).to(torch::kFloat32), 1);
    per_row.narrow(0, r, n).copy_(l.gather(1, m.safe.narrow(0, r, n).unsqueeze(1)).squeeze(1).neg_());
  }
  return masked ? masked_mean(per_row, m) : per_row.mean();
}

// out = l / rows in out's dtype, one pass (the multiplication in float32, then the cast).
void scale_into(torch::Tensor out, const torch::Tensor& l, double inv_rows) {
  torch::mul_out(out, l, torch::scalar_tensor(inv_rows, torch::kFloat64));
}

struct FusedCrossEntropy : torch::autograd::Function<FusedCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits, const torch::Tensor& targets_in,
                               int64_t rows_per_chunk, bool masked) {
    const int64_t rows = logits.size(0), classes = logits.size(1);
    const MaskedRows m = masked ? masked_rows(targets_in) : MaskedRows{targets_in, {}, {}};
    const torch::Tensor& targets = m.safe;
    torch::Tensor per_row = torch::empty({rows}, logits.options().dtype(torch::kFloat32));
    // The gradient in the logits' dtype: what backward of the unfused loss hands to the matmul
    // that made the logits (its float32 gradient cast back), never held in float32 here.
    torch::Tensor grad = torch::empty_like(logits, torch::MemoryFormat::Contiguous);
    const double inv_rows = 1.0 / double(rows);
    const int64_t step = rows_per_chunk > 0 ? rows_per_chunk : chunk_rows(classes);
    for (int64_t r = 0; r < rows; r += step) {
      const int64_t n = std::min(step, rows - r);
      if (softmax_gradient_kernel(logits.narrow(0, r, n), targets.narrow(0, r, n), per_row.narrow(0, r, n),
                                  grad.narrow(0, r, n), inv_rows))
        continue;
      const torch::Tensor chunk = logits.narrow(0, r, n).to(torch::kFloat32);
      scale_into(grad.narrow(0, r, n), loss_and_gradient(chunk, targets.narrow(0, r, n), per_row.narrow(0, r, n)),
                 inv_rows);
    }
    if (!masked) {
      ctx->save_for_backward({grad});
      return per_row.mean();
    }
    // Each row's gradient is (softmax - onehot) / rows so far: backward's one pass rescales it by
    // rows / counted, and a masked row by 0.
    ctx->save_for_backward({grad, m.weight * double(rows)});
    return masked_mean(per_row, m);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const variable_list saved = ctx->get_saved_variables();
    torch::Tensor grad = saved[0];
    // Scaled in place (in float32 arithmetic, a 0-dim factor keeps the dtype): this function's
    // backward runs once (thetad never retains the graph).
    if (saved.size() == 1) grad.mul_(grad_out[0]);
    else grad.mul_(saved[1] * grad_out[0]);
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

struct LinearCrossEntropy : torch::autograd::Function<LinearCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden, const torch::Tensor& weight,
                               const torch::Tensor& targets_in, int64_t rows_per_chunk, bool masked) {
    const int64_t rows = hidden.size(0), classes = weight.size(0);
    const MaskedRows m = masked ? masked_rows(targets_in) : MaskedRows{targets_in, {}, {}};
    const torch::Tensor& targets = m.safe;
    torch::Tensor per_row = torch::empty({rows}, hidden.options().dtype(torch::kFloat32));
    torch::Tensor grad_hidden = torch::empty_like(hidden, torch::MemoryFormat::Contiguous);
    const double inv_rows = 1.0 / double(rows);
    const int64_t step = rows_per_chunk > 0 ? rows_per_chunk : chunk_rows(classes);
    torch::Tensor w = weight;  // cast once to the logits' dtype (autocast would cast it per matmul)
    for (int64_t r = 0; r < rows; r += step) {
      const int64_t n = std::min(step, rows - r);
      const torch::Tensor logits = torch::matmul(hidden.narrow(0, r, n), w.t());
      if (w.scalar_type() != logits.scalar_type()) w = weight.to(logits.scalar_type());
      torch::Tensor out = grad_hidden.narrow(0, r, n);
      if (softmax_gradient_kernel(logits, targets.narrow(0, r, n), per_row.narrow(0, r, n), logits, inv_rows)) {
        // The logits' gradient, written over them, through the weight.
        if (out.scalar_type() == logits.scalar_type()) torch::mm_out(out, logits, w);
        else out.copy_(torch::mm(logits, w));
        continue;
      }
      const torch::Tensor l =
          loss_and_gradient(logits.to(torch::kFloat32), targets.narrow(0, r, n), per_row.narrow(0, r, n));
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
    if (!masked) {
      ctx->save_for_backward({grad_hidden});
      return per_row.mean();
    }
    // The rows' gradients were made with 1/rows: rescaled by rows / counted, a masked row's by 0
    // (one pass over a tensor of the hidden states' shape, not the logits').
    grad_hidden.mul_(m.weight * double(rows));
    ctx->save_for_backward({grad_hidden});
    return masked_mean(per_row, m);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    torch::Tensor grad = ctx->get_saved_variables()[0];
    grad.mul_(grad_out[0]);  // once: thetad never retains the graph
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// No gradient will be asked for: grad mode off (evaluation) or no input that needs one.
bool loss_alone(std::initializer_list<const torch::Tensor*> inputs) {
  if (!torch::GradMode::is_enabled()) return true;
  for (const torch::Tensor* t : inputs)
    if (t->requires_grad()) return false;
  return true;
}

}  // namespace

torch::Tensor linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                   const torch::Tensor& targets, int64_t rows_per_chunk, bool masked) {
  if (loss_alone({&hidden, &weight}))
    return loss_only(hidden.size(0), weight.size(0), targets, rows_per_chunk, masked, hidden.options(),
                     [&](int64_t r, int64_t n) { return torch::matmul(hidden.narrow(0, r, n), weight.t()); });
  if (weight.requires_grad())
    return fused_cross_entropy(torch::matmul(hidden, weight.t()), targets, rows_per_chunk, masked);
  return LinearCrossEntropy::apply(hidden, weight, targets, rows_per_chunk, masked);
}

torch::Tensor fused_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, int64_t rows_per_chunk,
                                  bool masked) {
  if (loss_alone({&logits}))
    return loss_only(logits.size(0), logits.size(1), targets, rows_per_chunk, masked, logits.options(),
                     [&](int64_t r, int64_t n) { return logits.narrow(0, r, n); });
  return FusedCrossEntropy::apply(logits, targets, rows_per_chunk, masked);
}

}  // namespace thetad::daemon
