// trunk_layer (see trunk_layer.hpp): forward computes what act(torch::addmm(b, x, W^T)) computes,
// under autocast too; backward repeats, op for op, what LibTorch's derivative formulas run for
// addmm and gelu (FunctionsManual.cpp mm_mat1_backward / mm_mat2_backward, gelu_backward, and the
// engine's sum_to of a broadcast bias), so the gradients carry the same bits as autograd's.
#include "daemon/ops/trunk_layer.hpp"

#include <ATen/ExpandUtils.h>
#include <ATen/autocast_mode.h>

#include <optional>

#include "common/errors.hpp"
#include "daemon/ops/precision.hpp"

namespace thetad::daemon {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Opt = c10::optional<torch::Tensor>;

struct Call {
  TrunkAct act;
  int layer;
  LayerWeights* weights;
  ActivationStash* stash;
};

// What autocast does to an addmm argument: floating tensors other than double go to its dtype.
torch::Tensor autocast_arg(const torch::Tensor& t, std::optional<torch::ScalarType> dtype) {
  if (!dtype || !t.is_floating_point() || t.scalar_type() == torch::kDouble || t.scalar_type() == *dtype) return t;
  return t.to(*dtype);
}

// LibTorch's mm_mat1_backward for mat1 = x, mat2 = W^T: a column-major x gets its gradient in
// column order (a different GEMM, hence different bits).
torch::Tensor grad_x_of(const torch::Tensor& gz, const torch::Tensor& W, bool x_col_major) {
  const torch::Tensor mat2 = W.t();
  if (x_col_major) return mat2.mm(gz.t()).t();
  return gz.mm(mat2.t());
}

// LibTorch's mm_mat2_backward for mat2 = W^T, transposed back to W's shape as TBackward does. W^T
// of a row-major W is column-major, so autograd computes (gz^T x)^T; a column-major W goes the other way.
torch::Tensor grad_w_of(const torch::Tensor& gz, const torch::Tensor& x, bool w_t_col_major) {
  if (w_t_col_major) return gz.t().mm(x);
  return x.t().mm(gz).t();
}

bool col_major(const torch::Tensor& t) { return t.stride(0) == 1 && t.stride(1) == t.size(0); }

torch::Tensor to_dtype(const torch::Tensor& g, int64_t dtype) {
  const auto want = static_cast<torch::ScalarType>(dtype);
  return (!g.defined() || g.scalar_type() == want) ? g : g.to(want);
}

torch::Tensor activate(const torch::Tensor& z, TrunkAct act) { return act == TrunkAct::gelu ? torch::gelu(z) : z; }

struct TrunkLayerFn : torch::autograd::Function<TrunkLayerFn> {
  // W, b: leaf weights, or nullopt with a provider; `anchor` (with a provider): an empty tensor
  // that requires grad so that a layer whose input needs no gradient (the first) still has a
  // backward (it never gets one). Optionals because LibTorch 1.13 takes no undefined tensor inputs.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const Opt& W_leaf, const Opt& b_leaf,
                               const Opt& anchor, const Call* call) {
    (void)anchor;
    const Call c = *call;
    torch::Tensor W, b;
    if (c.weights)
      std::tie(W, b) = c.weights->acquire(c.layer, /*backward=*/false);
    else
      W = *W_leaf, b = *b_leaf;
    THETAD_CHECK(W.dim() == 2 && b.dim() == 1 && x.dim() == 2 && x.size(1) == W.size(1) && b.size(0) == W.size(0),
                 InternalError, "trunk_layer ", c.layer, ": x ", x.sizes(), ", W ", W.sizes(), ", b ", b.sizes());
    const auto dtype = active_autocast_dtype(x.device().type());
    const torch::Tensor xc = autocast_arg(x, dtype), Wc = autocast_arg(W, dtype), bc = autocast_arg(b, dtype);
    const torch::Tensor z = torch::addmm(bc, xc, Wc.t());
    torch::Tensor y = activate(z, c.act);
    if (c.weights) c.weights->release(c.layer);

    auto& d = ctx->saved_data;
    d["act"] = static_cast<int64_t>(c.act);
    d["layer"] = static_cast<int64_t>(c.layer);
    d["weights"] = reinterpret_cast<int64_t>(c.weights);
    d["stash"] = reinterpret_cast<int64_t>(c.stash);
    d["x_col_major"] = col_major(xc);
    d["w_t_col_major"] = col_major(Wc.t());
    d["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    d["w_dtype"] = static_cast<int64_t>(W.scalar_type());
    d["wc_dtype"] = static_cast<int64_t>(Wc.scalar_type());
    d["b_dtype"] = static_cast<int64_t>(b.scalar_type());
    d["b_size"] = b.size(0);
    d["w_grad"] = c.weights ? c.weights->wants_grad(c.layer) : (W.requires_grad() || b.requires_grad());
    // The weights are parameters (or the provider's), not activations: only x and z go to the stash.
    std::vector<torch::Tensor> saved{c.weights ? torch::Tensor() : Wc};
    if (c.stash) {
      d["ticket"] = c.stash->put(c.layer, {xc, z});
    } else {
      saved.push_back(xc);
      saved.push_back(z);
    }
    ctx->save_for_backward(saved);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto& d = ctx->saved_data;
    const auto act = static_cast<TrunkAct>(d["act"].toInt());
    const int layer = static_cast<int>(d["layer"].toInt());
    auto* weights = reinterpret_cast<LayerWeights*>(d["weights"].toInt());
    auto* stash = reinterpret_cast<ActivationStash*>(d["stash"].toInt());
    variable_list saved = ctx->get_saved_variables();
    torch::Tensor Wc = saved.at(0), xc, z;
    if (stash) {
      std::vector<torch::Tensor> back = stash->take(d["ticket"].toInt());
      THETAD_CHECK(back.size() == 2, InternalError, "trunk_layer ", layer, ": the stash gave back ", back.size(),
                   " tensors, not 2");
      xc = back[0];
      z = back[1];
    } else {
      xc = saved.at(1);
      z = saved.at(2);
    }
    const torch::Tensor& g = grad_outputs.at(0);
    const torch::Tensor gz = act == TrunkAct::gelu ? at::gelu_backward(g, z, "none") : g;

    const bool want_w = d["w_grad"].toBool();
    const bool want_x = ctx->needs_input_grad(0);
    if (weights && want_x)
      Wc = to_dtype(weights->acquire(layer, /*backward=*/true).first, d["wc_dtype"].toInt());
    torch::Tensor gx, dW, db;
    if (want_x) gx = to_dtype(grad_x_of(gz, Wc, d["x_col_major"].toBool()), d["x_dtype"].toInt());
    if (want_w) {
      dW = to_dtype(grad_w_of(gz, xc, d["w_t_col_major"].toBool()), d["w_dtype"].toInt());
      const int64_t b_size = d["b_size"].toInt();
      db = to_dtype(at::sum_to(gz, torch::IntArrayRef(&b_size, 1)), d["b_dtype"].toInt());
    }
    // One gradient per argument of forward: x, W, b, anchor, the Call.
    if (!weights) return {gx, ctx->needs_input_grad(1) ? dW : torch::Tensor(),
                          ctx->needs_input_grad(2) ? db : torch::Tensor(), torch::Tensor(), torch::Tensor()};
    if (want_x) weights->release(layer);
    if (want_w) weights->grad(layer, dW, db);
    return {gx, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The anchor of layers with streamed weights (one per thread: autograd only reads its metadata).
const torch::Tensor& anchor() {
  thread_local const torch::Tensor a = torch::empty({0}).requires_grad_(true);
  return a;
}

}  // namespace

torch::Tensor trunk_layer(const torch::Tensor& x, const torch::Tensor& W, const torch::Tensor& b,
                          TrunkAct act, int layer, LayerWeights* weights, ActivationStash* stash) {
  const bool weights_grad = weights ? weights->wants_grad(layer) : (W.requires_grad() || b.requires_grad());
  if (!torch::GradMode::is_enabled() || !(x.requires_grad() || weights_grad)) {
    if (!weights) return activate(torch::addmm(b, x, W.t()), act);
    auto wb = weights->acquire(layer, /*backward=*/false);
    torch::Tensor y = activate(torch::addmm(wb.second, x, wb.first.t()), act);
    weights->release(layer);
    return y;
  }
  const Call call{act, layer, weights, stash};
  if (weights) return TrunkLayerFn::apply(x, Opt(), Opt(), Opt(anchor()), &call);
  // Under autocast the bias goes through autocast's cache of casts of leaves (W^T, a view, does
  // not): every use of it in this forward shares one cast node, where autograd sums the bias
  // gradients of all uses in bf16 before widening them once. Casting it here, outside the
  // function, keeps that sum as it was; W is cast inside, as each use casts it anew.
  if (const auto dtype = active_autocast_dtype(x.device().type()))
    return TrunkLayerFn::apply(x, Opt(W), Opt(at::autocast::cached_cast(*dtype, b, x.device().type())), Opt(), &call);
  return TrunkLayerFn::apply(x, Opt(W), Opt(b), Opt(), &call);
}

}  // namespace thetad::daemon
