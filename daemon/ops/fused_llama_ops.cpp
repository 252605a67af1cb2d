// The fused residual RMSNorm, SwiGLU and rotary split (see fused_llama_ops.hpp).
#include "daemon/ops/fused_llama_ops.hpp"

#if THETAD_TORCH_CUDA && THETAD_MODEL_KERNELS
#include <c10/cuda/CUDAStream.h>

#include "daemon/ops/llama_kernels.hpp"
#endif

#include "common/errors.hpp"
#include "daemon/ops/precision.hpp"

namespace thetad::daemon {

#if THETAD_TORCH_CUDA && THETAD_MODEL_KERNELS
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void* stream_of(const torch::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }
uint16_t* bits(const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); }

struct ResidualRmsNormFn : torch::autograd::Function<ResidualRmsNormFn> {
  // o empty (no sublayer's output: nodes take no undefined inputs): the output is n alone (h is
  // the sum); else {sum, n}.
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& h, const torch::Tensor& o,
                               const torch::Tensor& w, double eps) {
    const int64_t d = h.size(-1), rows = h.numel() / d;
    const bool add = o.numel() > 0;
    const torch::Tensor sum = add ? torch::empty_like(h) : h;
    const torch::Tensor n = torch::empty(h.sizes(), h.options().dtype(torch::kBFloat16));
    const torch::Tensor rstd = torch::empty({rows}, h.options());
    kernels::residual_rms_norm_forward(h.data_ptr<float>(), add ? bits(o) : nullptr, w.data_ptr<float>(),
                                       add ? sum.data_ptr<float>() : nullptr, bits(n), rstd.data_ptr<float>(), rows, d,
                                       static_cast<float>(eps), stream_of(h));
    ctx->save_for_backward({sum, w, rstd});
    ctx->saved_data["add"] = add;
    ctx->set_materialize_grads(false);  // the last norm's sum takes no gradient: no zeros made for it
    if (add) return {sum, n};
    return {n};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const bool add = ctx->saved_data["add"].toBool();
    const int64_t d = x.size(-1), rows = x.numel() / d;
    const torch::Tensor& g_n_in = grads[add ? 1 : 0];
    const torch::Tensor g_n = g_n_in.defined() ? g_n_in.to(torch::kBFloat16).contiguous()
                                               : torch::zeros(x.sizes(), x.options().dtype(torch::kBFloat16));
    const torch::Tensor g_sum = add && grads[0].defined() ? grads[0].to(torch::kFloat32).contiguous() : torch::Tensor();
    const torch::Tensor g_h = ctx->needs_input_grad(0) ? torch::empty_like(x) : torch::Tensor();
    const torch::Tensor g_o = add && ctx->needs_input_grad(1) ? torch::empty_like(g_n) : torch::Tensor();
    kernels::residual_rms_norm_backward(bits(g_n), x.data_ptr<float>(), saved[1].data_ptr<float>(),
                                        saved[2].data_ptr<float>(), g_sum.defined() ? g_sum.data_ptr<float>() : nullptr,
                                        g_h.defined() ? g_h.data_ptr<float>() : nullptr,
                                        g_o.defined() ? bits(g_o) : nullptr, rows, d, stream_of(x));
    return {g_h, g_o, torch::Tensor(), torch::Tensor()};
  }
};

struct SwigluJoinedFn : torch::autograd::Function<SwigluJoinedFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& gu, int64_t layer, int64_t stash_ptr) {
    const int64_t ff = gu.size(-1) / 2, rows = gu.numel() / gu.size(-1);
    std::vector<int64_t> shape = gu.sizes().vec();
    shape.back() = ff;
    torch::Tensor out = torch::empty(shape, gu.options());
    kernels::swiglu_forward(bits(gu), bits(out), rows, ff, stream_of(gu));
    auto* stash = reinterpret_cast<ActivationStash*>(stash_ptr);
    ctx->saved_data["stash"] = stash_ptr;
    if (stash) ctx->saved_data["ticket"] = stash->put(static_cast<int>(layer), {gu});
    else ctx->save_for_backward({gu});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto* stash = reinterpret_cast<ActivationStash*>(ctx->saved_data["stash"].toInt());
    const std::vector<torch::Tensor> saved = stash ? stash->take(ctx->saved_data["ticket"].toInt()) : ctx->get_saved_variables();
    THETAD_CHECK(saved.size() == 1u, InternalError, "swiglu_joined: ", saved.size(), " saved tensors came back");
    const torch::Tensor& gu = saved[0];
    const torch::Tensor g = grad_outputs.at(0).to(gu.scalar_type()).contiguous();
    torch::Tensor d_gu = torch::empty_like(gu);
    kernels::swiglu_backward(bits(gu), bits(g), bits(d_gu), gu.numel() / gu.size(-1), gu.size(-1) / 2, stream_of(gu));
    return {d_gu, torch::Tensor(), torch::Tensor()};
  }
};

kernels::RotaryShape rotary_shape(const torch::Tensor& qkv, int64_t heads, int64_t kv_heads, int64_t head) {
  return {qkv.size(0) * qkv.size(1), qkv.size(1), heads, kv_heads, head};
}

struct RotarySplitFn : torch::autograd::Function<RotarySplitFn> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& qkv, const torch::Tensor& cos,
                               const torch::Tensor& sin, int64_t heads, int64_t kv_heads, int64_t head) {
    const int64_t rows = qkv.size(0), seq = qkv.size(1);
    torch::Tensor q = torch::empty({rows, seq, heads * head}, qkv.options());
    torch::Tensor k = torch::empty({rows, seq, kv_heads * head}, qkv.options());
    torch::Tensor v = torch::empty({rows, seq, kv_heads * head}, qkv.options());
    kernels::rotary_split_forward(bits(qkv), cos.data_ptr<float>(), sin.data_ptr<float>(), bits(q), bits(k), bits(v),
                                  rotary_shape(qkv, heads, kv_heads, head), stream_of(qkv));
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["shape"] = std::vector<int64_t>{rows, seq, heads, kv_heads, head};
    return {q, k, v};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const std::vector<int64_t> d = ctx->saved_data["shape"].toIntVector();
    const int64_t rows = d[0], seq = d[1], heads = d[2], kv_heads = d[3], head = d[4];
    const auto opts = saved[0].options().dtype(torch::kBFloat16);
    const auto grad = [&](size_t i, int64_t n) {  // an output without a gradient contributes zeros
      return grads[i].defined() ? grads[i].to(torch::kBFloat16).contiguous() : torch::zeros({rows, seq, n * head}, opts);
    };
    const torch::Tensor dq = grad(0, heads), dk = grad(1, kv_heads), dv = grad(2, kv_heads);
    torch::Tensor d_qkv = torch::empty({rows, seq, (heads + 2 * kv_heads) * head}, opts);
    kernels::rotary_split_backward(bits(dq), bits(dk), bits(dv), saved[0].data_ptr<float>(), saved[1].data_ptr<float>(),
                                   bits(d_qkv), {rows * seq, seq, heads, kv_heads, head}, stream_of(d_qkv));
    return {d_qkv, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool residual_rms_norm_fits(const torch::Tensor& h, const torch::Tensor& o, const torch::Tensor& w) {
  if (!h.defined() || !h.is_cuda() || h.scalar_type() != torch::kFloat32 || !h.is_contiguous() || w.requires_grad())
    return false;
  if (active_autocast_dtype(h.device().type()) != torch::kBFloat16) return false;
  return !o.defined() || (fused_kernels_for(o) && o.sizes() == h.sizes() && o.device() == h.device());
}

std::pair<torch::Tensor, torch::Tensor> residual_rms_norm(const torch::Tensor& h, const torch::Tensor& o,
                                                          const torch::Tensor& w, double eps) {
  const torch::Tensor add = o.defined() ? o : torch::empty({0}, h.options().dtype(torch::kBFloat16));
  const variable_list out = ResidualRmsNormFn::apply(h, add, w.to(torch::kFloat32).contiguous(), eps);
  if (o.defined()) return {out[0], out[1]};
  return {h, out[0]};
}

bool fused_kernels_for(const torch::Tensor& x) {
  return x.defined() && x.is_cuda() && x.scalar_type() == torch::kBFloat16 && x.is_contiguous();
}

torch::Tensor swiglu_joined(const torch::Tensor& gu, int layer, ActivationStash* stash) {
  return SwigluJoinedFn::apply(gu, static_cast<int64_t>(layer), reinterpret_cast<int64_t>(stash));
}

std::array<torch::Tensor, 3> rotary_split(const torch::Tensor& qkv, const RotaryTables& rotary, int64_t heads,
                                          int64_t kv_heads, int64_t head) {
  const torch::Tensor cos = rotary.cos.narrow(0, 0, qkv.size(1)).contiguous();
  const torch::Tensor sin = rotary.sin.narrow(0, 0, qkv.size(1)).contiguous();
  const variable_list out = RotarySplitFn::apply(qkv, cos, sin, heads, kv_heads, head);
  return {out[0], out[1], out[2]};
}

#else

bool residual_rms_norm_fits(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&) { return false; }

std::pair<torch::Tensor, torch::Tensor> residual_rms_norm(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                                          double) {
  throw InternalError("residual_rms_norm: this build has no model kernels");
}

bool fused_kernels_for(const torch::Tensor&) { return false; }

torch::Tensor swiglu_joined(const torch::Tensor&, int, ActivationStash*) {
  throw InternalError("swiglu_joined: this build has no model kernels");
}

std::array<torch::Tensor, 3> rotary_split(const torch::Tensor&, const RotaryTables&, int64_t, int64_t, int64_t) {
  throw InternalError("rotary_split: this build has no model kernels");
}

#endif

}  // namespace thetad::daemon
