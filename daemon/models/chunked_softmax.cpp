// The chunked softmax cross-entropy (see chunked_softmax.hpp): a custom autograd Function whose
// two passes stream the output layer's row chunks from a ShardSource.
#include "daemon/models/chunked_softmax.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "common/errors.hpp"

namespace thetad::daemon {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Calls fn(k, W_k) for each of the task's chunks, in order or in reverse, holding at most two:
// the next chunk is requested before the current one is computed (its copy overlaps that
// compute), and the current one is given back once its compute is queued.
template <typename Fn>
void stream_chunks(ShardSource& source, int task, bool reverse, Fn&& fn) {
  const int n = source.num_chunks(task);
  THETAD_CHECK(n >= 1, InternalError, "task ", task, " has no chunks");
  const auto at = [n, reverse](int i) { return reverse ? n - 1 - i : i; };
  torch::Tensor cur = source.chunk(task, at(0));
  for (int i = 0; i < n; ++i) {
    torch::Tensor next = i + 1 < n ? source.chunk(task, at(i + 1)) : torch::Tensor();
    fn(at(i), cur);
    source.done(task, at(i));
    cur = std::move(next);
  }
}

torch::Tensor with_ones(const torch::Tensor& h) {
  return torch::cat({h, torch::ones({h.size(0), 1}, h.options())}, 1);
}

// Column index of each row's label within the chunk starting at row r0 of rk rows (clamped),
// and whether the label lies in the chunk.
std::pair<torch::Tensor, torch::Tensor> local_labels(const torch::Tensor& y, int64_t r0, int64_t rk) {
  const torch::Tensor local = y - r0;
  const torch::Tensor in = local.ge(0).logical_and(local.lt(rk));
  return {local.clamp(0, rk - 1).unsqueeze(1), in};
}

// The columns a chunk contributes to the softmax: all its rows (no class subset), or the rows
// of the sorted class subset that fall in it. `c0` is the first column's index in the softmax's
// class space (row r0 without a subset, the position in the subset with one).
struct ChunkCols {
  int64_t c0 = 0, cols = 0;
  torch::Tensor rows;  // subset: row indices within the chunk (int64, on the device); else undefined
};

ChunkCols cols_at(const torch::Tensor& subset_dev, int64_t r0, int64_t c0, int64_t cols);

// Per chunk of rows [r0, r0+rk): the columns above. `subset_host` is the sorted subset on the
// CPU (undefined: every row is a class).
ChunkCols chunk_cols(const torch::Tensor& subset_host, const torch::Tensor& subset_dev, int64_t r0, int64_t rk) {
  if (!subset_host.defined()) return {r0, rk, torch::Tensor()};
  const int64_t* v = subset_host.data_ptr<int64_t>();
  const int64_t n = subset_host.numel();
  const int64_t a = std::lower_bound(v, v + n, r0) - v, b = std::lower_bound(v, v + n, r0 + rk) - v;
  return cols_at(subset_dev, r0, a, b - a);
}

// The same from a range of the subset found before (backward reuses forward's ranges).
ChunkCols cols_at(const torch::Tensor& subset_dev, int64_t r0, int64_t c0, int64_t cols) {
  ChunkCols c{c0, cols, torch::Tensor()};
  if (subset_dev.numel() > 0 && cols > 0) c.rows = subset_dev.narrow(0, c0, cols) - r0;
  return c;
}

// The chunk's weights for its columns.
torch::Tensor chunk_weights(const torch::Tensor& w, const ChunkCols& c) {
  return c.rows.defined() ? w.index_select(0, c.rows) : w;
}

class ChunkedSoftmaxXent : public torch::autograd::Function<ChunkedSoftmaxXent> {
 public:
  // `labels`: each row's class in the softmax's class space (its row, or its position in the
  // subset). `subset`: sorted class rows (empty: all rows).
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor h, torch::Tensor weight,
                               torch::Tensor labels, torch::Tensor subset, ShardSource* source,
                               int64_t task) {
    const torch::Tensor h1 = with_ones(h);
    const int64_t batch = h.size(0);
    // The log-sum-exp, the target's logit and the loss in float32 whatever h's dtype (bf16 under
    // precision: bf16): only the chunk's matmul runs in h's dtype.
    auto opts = h.options().dtype(torch::kFloat32);
    const torch::Tensor subset_host = subset.numel() > 0 ? subset.cpu() : torch::Tensor();
    torch::Tensor m = torch::full({batch}, -std::numeric_limits<float>::infinity(), opts);
    torch::Tensor s = torch::zeros({batch}, opts);
    torch::Tensor target = torch::zeros({batch}, opts);
    std::vector<int64_t> begins, col_begins, col_counts;  // per chunk, for backward
    int64_t r0 = 0;
    stream_chunks(*source, static_cast<int>(task), false, [&](int k, const torch::Tensor& w) {
      THETAD_CHECK_EQ(static_cast<size_t>(k), begins.size(), "chunks out of order");
      const int64_t rk = w.size(0);
      const ChunkCols c = chunk_cols(subset_host, subset, r0, rk);
      begins.push_back(r0);
      col_begins.push_back(c.c0);
      col_counts.push_back(c.cols);
      r0 += rk;
      if (c.cols == 0) return;
      const torch::Tensor logits = torch::mm(h1, chunk_weights(w, c).to(h1.scalar_type()).t()).to(torch::kFloat32);
      // Online log-sum-exp: rescale the running sum to the new running max.
      const torch::Tensor m_new = torch::maximum(m, std::get<0>(logits.max(1)));
      s = s * torch::exp(m - m_new) + torch::exp(logits - m_new.unsqueeze(1)).sum(1);
      m = m_new;
      const auto [idx, in] = local_labels(labels, c.c0, c.cols);
      target.add_(logits.gather(1, idx).squeeze(1).masked_fill_(in.logical_not(), 0));
    });
    THETAD_CHECK_EQ(r0, weight.size(0), "chunks of task ", task, " do not cover its rows");
    const torch::Tensor lse = m + torch::log(s);
    ctx->save_for_backward({h1, weight, labels, lse, subset});
    ctx->saved_data["source"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(source));
    ctx->saved_data["task"] = task;
    ctx->saved_data["begins"] = begins;
    ctx->saved_data["col_begins"] = col_begins;
    ctx->saved_data["col_counts"] = col_counts;
    return (lse - target).mean();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& h1 = saved[0];
    torch::Tensor weight = saved[1];
    const torch::Tensor& labels = saved[2];
    const torch::Tensor& lse = saved[3];
    const torch::Tensor& subset = saved[4];
    auto* source = reinterpret_cast<ShardSource*>(static_cast<intptr_t>(ctx->saved_data["source"].toInt()));
    const int task = static_cast<int>(ctx->saved_data["task"].toInt());
    const std::vector<int64_t> begins = ctx->saved_data["begins"].toIntVector();
    const std::vector<int64_t> col_begins = ctx->saved_data["col_begins"].toIntVector();
    const std::vector<int64_t> col_counts = ctx->saved_data["col_counts"].toIntVector();
    const bool want_h = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    const torch::Tensor scale = grad_out[0] / static_cast<double>(h1.size(0));
    // Backward runs outside autocast: the matmuls in h1's dtype (the compute dtype forward used),
    // dlogits and the sums over chunks in float32.
    const torch::ScalarType compute = h1.scalar_type();
    const bool fp32 = compute == torch::kFloat32;
    torch::Tensor dh1 = want_h ? torch::zeros(h1.sizes(), h1.options().dtype(torch::kFloat32)) : torch::Tensor();
    // The chunk's weight gradient: where the source wants it, else a slice of .grad (whole).
    const auto dw_chunk = [&](int k, int64_t r0, int64_t rk) {
      torch::Tensor g = source->grad_chunk(task, k);
      if (g.defined()) return g;
      if (!weight.grad().defined()) weight.mutable_grad() = torch::zeros(weight.sizes(), h1.options().dtype(weight.scalar_type()));
      return weight.grad().narrow(0, r0, rk);
    };
    if (want_h || want_w) {
      stream_chunks(*source, task, true, [&](int k, const torch::Tensor& w) {
        const int64_t r0 = begins.at(static_cast<size_t>(k)), rk = w.size(0);
        const auto kk = static_cast<size_t>(k);
        const ChunkCols c = cols_at(subset, r0, col_begins.at(kk), col_counts.at(kk));
        if (c.cols == 0) {  // no class of the subset here: no gradient, but the chunk is done
          if (want_w) source->grad_done(task, k);
          return;
        }
        const torch::Tensor wc = chunk_weights(w, c).to(compute);
        torch::Tensor dlogits = torch::exp(torch::mm(h1, wc.t()).to(torch::kFloat32) - lse.unsqueeze(1));  // softmax
        const auto [idx, in] = local_labels(labels, c.c0, c.cols);
        dlogits.scatter_add_(1, idx, in.to(dlogits.scalar_type()).neg().unsqueeze(1));
        dlogits.mul_(scale);
        const torch::Tensor dl = dlogits.to(compute);  // float32: the same tensor
        if (want_w) {
          torch::Tensor dw = dw_chunk(k, r0, rk);
          if (c.rows.defined()) dw.index_add_(0, c.rows, torch::mm(dl.t(), h1).to(dw.scalar_type()));
          else if (fp32) dw.addmm_(dl.t(), h1);
          else dw.add_(torch::mm(dl.t(), h1));
          source->grad_done(task, k);
        }
        if (want_h && fp32) dh1.addmm_(dl, wc);
        else if (want_h) dh1.add_(torch::mm(dl, wc));
      });
    }
    torch::Tensor dh = want_h ? dh1.narrow(1, 0, h1.size(1) - 1).to(compute) : torch::Tensor();
    return {dh, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

ResidentChunks::ResidentChunks(std::vector<torch::Tensor> mats, int64_t chunk_rows)
    : mats_(std::move(mats)), chunk_rows_(chunk_rows) {
  THETAD_CHECK(chunk_rows_ >= 1, InternalError, "chunk rows must be >= 1, got ", chunk_rows_);
}

int ResidentChunks::num_chunks(int task) {
  const int64_t rows = mats_.at(static_cast<size_t>(task)).size(0);
  return static_cast<int>((rows + chunk_rows_ - 1) / chunk_rows_);
}

torch::Tensor ResidentChunks::chunk(int task, int k) {
  const torch::Tensor& m = mats_.at(static_cast<size_t>(task));
  const int64_t r0 = static_cast<int64_t>(k) * chunk_rows_;
  return m.detach().narrow(0, r0, std::min(chunk_rows_, m.size(0) - r0));
}

torch::Tensor chunked_softmax_xent(const torch::Tensor& h, const torch::Tensor& weight,
                                   const torch::Tensor& y, ShardSource& source, int task) {
  // No subset: an empty tensor (an undefined one is not a valid autograd Function input).
  return ChunkedSoftmaxXent::apply(h, weight, y, torch::empty({0}, y.options()), &source,
                                   static_cast<int64_t>(task));
}

torch::Tensor chunked_sampled_softmax_xent(const torch::Tensor& h, const torch::Tensor& weight,
                                           const torch::Tensor& y, const torch::Tensor& classes,
                                           ShardSource& source, int task) {
  // Each label's position among the classes (the classes include every label).
  const torch::Tensor labels = torch::searchsorted(classes, y);
  return ChunkedSoftmaxXent::apply(h, weight, labels, classes, &source, static_cast<int64_t>(task));
}

torch::Tensor chunked_logits(const torch::Tensor& h, ShardSource& source, int task) {
  torch::NoGradGuard no_grad;
  const torch::Tensor h1 = with_ones(h);
  std::vector<torch::Tensor> parts;
  stream_chunks(source, task, false, [&](int, const torch::Tensor& w) {
    parts.push_back(torch::mm(h1, w.to(h1.scalar_type()).t()));
  });
  return torch::cat(parts, 1);
}

}  // namespace thetad::daemon
