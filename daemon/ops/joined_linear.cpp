// Joined linear layers and their adapters (see joined_linear.hpp).
#include "daemon/ops/joined_linear.hpp"

#include <algorithm>

#include "daemon/ops/precision.hpp"

namespace thetad::daemon {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The [k, tokens, last] batches of t's (contiguous) shares of rows: one batch of all n where
// the shares are equal (batched GEMMs), else a batch of one per share.
std::vector<torch::Tensor> shares(const torch::Tensor& t, const std::vector<int64_t>& rows) {
  const int64_t last = t.size(-1);
  if (std::all_of(rows.begin(), rows.end(), [&](int64_t r) { return r == rows.front(); }))
    return {t.view({static_cast<int64_t>(rows.size()), -1, last})};
  std::vector<torch::Tensor> out;
  int64_t at = 0;
  for (int64_t r : rows) {
    out.push_back(t.narrow(0, at, r).view({1, -1, last}));
    at += r;
  }
  return out;
}

// The adapters [n, ...] of the batches shares() makes: all of them, or one task's each.
std::vector<torch::Tensor> task_batches(const torch::Tensor& t, const std::vector<int64_t>& rows, size_t batches) {
  if (batches == 1) return {t};
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < rows.size(); ++i) out.push_back(t.narrow(0, static_cast<int64_t>(i), 1));
  return out;
}

// An output a GEMM writes with beta = 0: uninitialised on the GPU, zeros on the CPU, where
// LibTorch 1.13's GEMM multiplies the old values by beta (garbage times 0 may be NaN).
torch::Tensor blank(at::IntArrayRef sizes, const torch::TensorOptions& options) {
  return options.device().is_cuda() ? torch::empty(sizes, options) : torch::zeros(sizes, options);
}

// The base matrix a GEMM reads, in dt: w cast, or f's values from its source, where ctx then
// keeps what backward needs to ask for them again (not the values: the source may reuse their
// memory for the next GEMM's once let_go says this one is queued).
torch::Tensor forward_weight(AutogradContext* ctx, const torch::Tensor& w, const FrozenWeight& f, torch::ScalarType dt) {
  if (!f.source) return w.to(dt);
  // The source outlives the pass (the model's, or its home's); a pointer is what an IValue holds.
  ctx->saved_data["frozen_source"] = reinterpret_cast<int64_t>(f.source);
  ctx->saved_data["frozen_id"] = static_cast<int64_t>(f.id);
  ctx->saved_data["frozen_dtype"] = static_cast<int64_t>(dt);
  return f.source->acquire(f.id, dt, /*backward=*/false);
}

FrozenWeight saved_frozen(AutogradContext* ctx) {
  const auto it = ctx->saved_data.find("frozen_source");
  if (it == ctx->saved_data.end()) return {};
  return {reinterpret_cast<FrozenWeights*>(it->second.toInt()), static_cast<int>(ctx->saved_data["frozen_id"].toInt())};
}

// The base matrix again in backward: the one forward saved, or the source's values once more.
torch::Tensor backward_weight(AutogradContext* ctx, const torch::Tensor& saved) {
  const FrozenWeight f = saved_frozen(ctx);
  if (!f.source) return saved;
  return f.source->acquire(f.id, static_cast<torch::ScalarType>(ctx->saved_data["frozen_dtype"].toInt()), /*backward=*/true);
}

// The GEMMs that read forward_weight's or backward_weight's values are queued.
void let_go(const FrozenWeight& f) {
  if (f.source) f.source->done(f.id);
}

// The base's GEMM and the adapters' two as one node: forward adds the adapters' product into the
// base GEMM's output in place (beta = 1), backward adds the adapters' share of the input's
// gradient into the base's the same way; autograd's nodes would copy the output to add into a
// new tensor, and sum the two gradients of the input in a pass of their own.
struct LoraLinearFn : torch::autograd::Function<LoraLinearFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& bias, const torch::Tensor& a, const torch::Tensor& b, double scale,
                               const std::vector<int64_t>& rows, const FrozenWeight& q) {
    // What autocast would compute in (it stays on here, but an in-place GEMM is not among its
    // operators): every operand cast to it once.
    const torch::ScalarType dt = active_autocast_dtype(x.device().type()).value_or(x.scalar_type());
    const torch::Tensor xc = x.to(dt).contiguous(), wc = forward_weight(ctx, w, q, dt), ac = a.to(dt), bc = b.to(dt);
    const int64_t in = x.size(-1), out = wc.size(0), rank = a.size(1);
    const auto shape = [&](int64_t last) {
      std::vector<int64_t> s = x.sizes().vec();
      s.back() = last;
      return s;
    };
    const bool with_bias = bias.numel() > 0;
    torch::Tensor y = with_bias ? torch::empty(shape(out), xc.options()) : blank(shape(out), xc.options());
    torch::Tensor z = torch::empty(shape(rank), xc.options());
    const torch::Tensor x2 = xc.view({-1, in});
    torch::Tensor y2 = y.view({-1, out});
    // With a bias, the base GEMM (bias in its epilogue) first and the product added to it. Without
    // one (the llama family), the product first and the base GEMM adding into it (beta = 1): its
    // epilogue reads the output while the GEMM is bound by math, where the other order makes the
    // product's GEMM read and write the whole output once more, bound by memory.
    if (with_bias) torch::addmm_out(y2, bias.to(dt), x2, wc.t());
    const std::vector<torch::Tensor> xs = shares(xc, rows), ys = shares(y, rows), zs = shares(z, rows);
    const std::vector<torch::Tensor> as = task_batches(ac, rows, xs.size()), bs = task_batches(bc, rows, xs.size());
    for (size_t i = 0; i < xs.size(); ++i) {
      torch::Tensor zi = zs[i], yi = ys[i];
      torch::bmm_out(zi, xs[i], as[i].transpose(1, 2));
      torch::baddbmm_out(yi, yi, zi, bs[i].transpose(1, 2), /*beta=*/with_bias ? 1 : 0, /*alpha=*/scale);
    }
    if (!with_bias) y2.addmm_(x2, wc.t());
    let_go(q);
    ctx->save_for_backward({xc, q.source ? torch::Tensor() : wc, ac, bc, z});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["rows"] = rows;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &a = saved[2], &b = saved[3], &z = saved[4];
    const double scale = ctx->saved_data["scale"].toDouble();
    const std::vector<int64_t> rows = ctx->saved_data["rows"].toIntVector();
    const int64_t in = x.size(-1), out = grads[0].size(-1);
    const torch::Tensor g = grads[0].to(x.scalar_type()).contiguous();
    const torch::Tensor g2 = g.view({-1, out});
    const std::vector<torch::Tensor> gs = shares(g, rows), xs = shares(x, rows), zs = shares(z, rows);
    const std::vector<torch::Tensor> as = task_batches(a, rows, gs.size()), bs = task_batches(b, rows, gs.size());
    // The gradient of z = x a^T. The products scaled by the GEMMs' alpha, no pass of their own,
    // beta 0 (into blank()s).
    const auto scaled_product = [scale](torch::Tensor out, const torch::Tensor& m1, const torch::Tensor& m2) {
      torch::baddbmm_out(out, out, m1, m2, /*beta=*/0, /*alpha=*/scale);
    };
    const auto blank_like = [](const torch::Tensor& like) { return blank(like.sizes(), like.options()); };
    // Only x's and a's gradients read it.
    const bool need_dz = ctx->needs_input_grad(0) || ctx->needs_input_grad(3);
    const torch::Tensor dz = need_dz ? blank_like(z) : torch::Tensor();
    const std::vector<torch::Tensor> dzs = need_dz ? shares(dz, rows) : std::vector<torch::Tensor>();
    for (size_t i = 0; i < dzs.size(); ++i) scaled_product(dzs[i], gs[i], bs[i]);
    torch::Tensor dx, dw, dbias, da, db;
    if (ctx->needs_input_grad(0)) {
      // The adapters' share first, the base GEMM adding into it: the forward's order, and why.
      dx = torch::empty_like(x);
      const std::vector<torch::Tensor> dxs = shares(dx, rows);
      for (size_t i = 0; i < gs.size(); ++i) {
        torch::Tensor dxi = dxs[i];
        torch::bmm_out(dxi, dzs[i], as[i]);
      }
      dx.view({-1, in}).addmm_(g2, backward_weight(ctx, saved[1]));
      let_go(saved_frozen(ctx));
    }
    if (ctx->needs_input_grad(1)) dw = torch::mm(g2.t(), x.view({-1, in}));
    if (ctx->needs_input_grad(2)) dbias = g2.sum(0);  // never for the placeholder: it takes no gradient
    if (ctx->needs_input_grad(3)) {
      da = torch::empty_like(a);
      const std::vector<torch::Tensor> das = task_batches(da, rows, gs.size());
      for (size_t i = 0; i < gs.size(); ++i) {
        torch::Tensor dai = das[i];
        torch::bmm_out(dai, dzs[i].transpose(1, 2), xs[i]);
      }
    }
    if (ctx->needs_input_grad(4)) {
      db = blank_like(b);
      const std::vector<torch::Tensor> dbs = task_batches(db, rows, gs.size());
      for (size_t i = 0; i < gs.size(); ++i) scaled_product(dbs[i], gs[i].transpose(1, 2), zs[i]);
    }
    return {dx, dw, dbias, da, db, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// x w^T (+ bias) of a frozen w from a source, for a matrix without adapters: its values asked for
// the GEMM of forward and again for that of x's gradient.
struct FrozenLinearFn : torch::autograd::Function<FrozenLinearFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& bias,
                               const FrozenWeight& q) {
    const torch::ScalarType dt = active_autocast_dtype(x.device().type()).value_or(x.scalar_type());
    const torch::Tensor xc = x.to(dt).contiguous(), wc = forward_weight(ctx, torch::Tensor(), q, dt);
    const torch::Tensor x2 = xc.view({-1, xc.size(-1)});
    const torch::Tensor y2 = bias.numel() > 0 ? torch::addmm(bias.to(dt), x2, wc.t()) : torch::mm(x2, wc.t());
    let_go(q);
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = wc.size(0);
    ctx->saved_data["in_shape"] = x.sizes().vec();
    return y2.view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const torch::Tensor w = backward_weight(ctx, torch::Tensor());
    const torch::Tensor g2 = grads[0].to(w.scalar_type()).reshape({-1, w.size(0)});
    torch::Tensor dx, dbias;
    if (ctx->needs_input_grad(0)) dx = torch::mm(g2, w).view(ctx->saved_data["in_shape"].toIntVector());
    let_go(saved_frozen(ctx));
    if (ctx->needs_input_grad(1)) dbias = g2.sum(0);
    return {dx, dbias, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor join_rows(const std::vector<torch::Tensor>& parts) {
  if (parts.size() < 2) return {};
  const torch::Tensor& first = parts.front();
  for (const torch::Tensor& p : parts) {
    if (!p.defined() || !p.is_contiguous() || p.device() != first.device() || p.scalar_type() != first.scalar_type() ||
        p.dim() != first.dim() || p.sizes().slice(1) != first.sizes().slice(1) || p.requires_grad())
      return {};
  }
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> values;
  for (const torch::Tensor& p : parts) values.push_back(p.detach());
  torch::Tensor joined = torch::cat(values, 0);
  int64_t row = 0;
  for (torch::Tensor p : parts) {  // a handle of the same TensorImpl: set_data reaches every holder
    const int64_t rows = p.size(0);
    p.set_data(joined.narrow(0, row, rows));
    row += rows;
  }
  return joined;
}

bool joined_in(const torch::Tensor& joined, const std::vector<torch::Tensor>& parts) {
  if (!joined.defined()) return false;
  const auto* at = static_cast<const char*>(joined.data_ptr());
  const int64_t bytes = static_cast<int64_t>(joined.element_size());
  for (const torch::Tensor& p : parts) {
    if (!p.defined() || p.device() != joined.device() || p.scalar_type() != joined.scalar_type() ||
        p.data_ptr() != at || !p.is_contiguous())
      return false;
    at += p.numel() * bytes;
  }
  return at == static_cast<const char*>(joined.data_ptr()) + joined.numel() * bytes;
}

torch::Tensor join_lora_a(const std::vector<torch::Tensor>& as) { return as.size() == 1 ? as.front() : torch::cat(as, 1); }

torch::Tensor join_lora_b(const std::vector<torch::Tensor>& bs, const std::vector<int64_t>& outs) {
  const torch::Tensor* some = nullptr;
  int64_t adapted = 0;
  for (const torch::Tensor& b : bs) {
    if (!b.defined()) continue;
    some = some ? some : &b;
    ++adapted;
  }
  if (bs.size() == 1) return bs.front();
  const int64_t n = some->size(0), r = some->size(2);
  // Zeros as a broadcast scalar: cat reads it for each block, nothing of their size is written.
  const torch::Tensor zero = torch::zeros({1, 1, 1}, some->options().requires_grad(false));
  std::vector<torch::Tensor> rows;
  int64_t column = 0;
  for (size_t i = 0; i < bs.size(); ++i) {
    const int64_t out = outs[i];
    if (!bs[i].defined()) {
      rows.push_back(zero.expand({n, out, adapted * r}));
      continue;
    }
    std::vector<torch::Tensor> row;
    if (column > 0) row.push_back(zero.expand({n, out, column * r}));
    row.push_back(bs[i]);
    if (column + 1 < adapted) row.push_back(zero.expand({n, out, (adapted - column - 1) * r}));
    rows.push_back(row.size() == 1 ? row.front() : torch::cat(row, 2));
    ++column;
  }
  return torch::cat(rows, 1);
}

torch::Tensor lora_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                          const torch::Tensor& a, const torch::Tensor& b, double scale, const std::vector<int64_t>& rows) {
  // No bias: an empty tensor (LibTorch 1.13's nodes take no undefined inputs).
  return LoraLinearFn::apply(x, w, bias.defined() ? bias : torch::empty({0}, w.options()), a, b, scale, rows,
                             FrozenWeight{});
}

torch::Tensor lora_linear(const torch::Tensor& x, const FrozenWeight& w, const torch::Tensor& bias,
                          const torch::Tensor& a, const torch::Tensor& b, double scale, const std::vector<int64_t>& rows) {
  const torch::Tensor none = torch::empty({0}, x.options().requires_grad(false));
  return LoraLinearFn::apply(x, none, bias.defined() ? bias : none, a, b, scale, rows, w);
}

torch::Tensor frozen_linear(const torch::Tensor& x, const FrozenWeight& w, const torch::Tensor& bias) {
  return FrozenLinearFn::apply(x, bias.defined() ? bias : torch::empty({0}, x.options().requires_grad(false)), w);
}

}  // namespace thetad::daemon
