// ffn_activation (see ffn_activation.hpp).
#include "daemon/ops/ffn_activation.hpp"

#include "common/errors.hpp"

namespace thetad::daemon {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

torch::Tensor plain(const torch::Tensor& gate, const torch::Tensor& up) {
  return gate.defined() ? torch::silu(gate) * up : torch::gelu(up);
}

// An optional input: apply() refuses undefined tensors.
using Opt = c10::optional<torch::Tensor>;

struct FfnActivationFn : torch::autograd::Function<FfnActivationFn> {
  // No `gate`: gelu. The stash travels as an integer (saved_data holds IValues).
  static torch::Tensor forward(AutogradContext* ctx, const Opt& gate_in, const torch::Tensor& up, int64_t layer,
                               int64_t stash_ptr) {
    const torch::Tensor gate = gate_in ? *gate_in : torch::Tensor();
    auto* stash = reinterpret_cast<ActivationStash*>(stash_ptr);
    std::vector<torch::Tensor> saved = gate.defined() ? std::vector<torch::Tensor>{gate, up} : std::vector<torch::Tensor>{up};
    ctx->saved_data["swiglu"] = gate.defined();
    ctx->saved_data["stash"] = stash_ptr;
    if (stash) {
      ctx->saved_data["ticket"] = stash->put(static_cast<int>(layer), saved);
    } else {
      ctx->save_for_backward(saved);
    }
    return plain(gate, up);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto& d = ctx->saved_data;
    auto* stash = reinterpret_cast<ActivationStash*>(d["stash"].toInt());
    const bool swiglu = d["swiglu"].toBool();
    const std::vector<torch::Tensor> saved = stash ? stash->take(d["ticket"].toInt()) : ctx->get_saved_variables();
    THETAD_CHECK(saved.size() == (swiglu ? 2u : 1u), InternalError, "ffn_activation: ", saved.size(),
                 " saved tensors came back");
    const torch::Tensor& g = grad_outputs.at(0);
    if (!swiglu) return {torch::Tensor(), at::gelu_backward(g, saved[0], "none"), torch::Tensor(), torch::Tensor()};
    // As autograd differentiates silu(gate) * up: the product's two factors, then silu's.
    const torch::Tensor& gate = saved[0];
    const torch::Tensor& up = saved[1];
    torch::Tensor d_gate, d_up;
    if (ctx->needs_input_grad(1)) d_up = g * torch::silu(gate);
    if (ctx->needs_input_grad(0)) d_gate = at::silu_backward(g * up, gate);
    return {d_gate, d_up, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor ffn_activation(const torch::Tensor& gate, const torch::Tensor& up, int layer, ActivationStash* stash) {
  const bool differentiated = up.requires_grad() || (gate.defined() && gate.requires_grad());
  if (!torch::GradMode::is_enabled() || !differentiated) return plain(gate, up);
  return FfnActivationFn::apply(gate.defined() ? Opt(gate) : Opt(), up, static_cast<int64_t>(layer),
                               reinterpret_cast<int64_t>(stash));
}

}  // namespace thetad::daemon
