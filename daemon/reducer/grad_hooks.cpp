// Autograd hooks into the engine (see grad_hooks.hpp).
#include "daemon/reducer/grad_hooks.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <set>
#include <utility>

#include "common/errors.hpp"

namespace thetad::daemon {

GradHooks::GradHooks(ParamGroups& groups, comm::Engine& engine, const DataPlane& plane,
                     const std::vector<comm::GradMemory>& modes, comm::LaunchHandler take_launches)
    : groups_(groups), engine_(engine), take_launches_(std::move(take_launches)), plane_(plane), modes_(modes) {
  views_.resize(groups_.size());
  requires_grad_.assign(static_cast<size_t>(groups_.num_groups()), 1);
  for (size_t i = 0; i < groups_.size(); ++i) {
    auto& p = groups_[static_cast<int>(i)].tensor;
    const comm::GradMemory mode = modes.at(static_cast<size_t>(groups_[static_cast<int>(i)].group));
    if (mode == comm::GradMemory::overwrite) overwrite_params_.push_back(static_cast<int>(i));
    if (mode == comm::GradMemory::adopted) adopted_.push_back(1);
    else adopted_.push_back(0);
    if (mode != comm::GradMemory::owned && mode != comm::GradMemory::overwrite) continue;
    // Gradients live in the engine's flat bucket buffers: .grad is a view of them.
    views_[i] = torch::from_blob(engine_.grad(static_cast<int>(i)), p.sizes(),
                                 torch::TensorOptions().dtype(torch::kFloat32).device(plane_.device));
    p.mutable_grad() = views_[i];
  }
  install();
}

void GradHooks::install() {
  for (size_t i = 0; i < groups_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(groups_[static_cast<int>(i)].tensor);
    THETAD_CHECK(acc != nullptr, InternalError, "no grad accumulator for ", groups_[static_cast<int>(i)].name);
    const int index = static_cast<int>(i);
    acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, index](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          on_gradient(index);
          return outputs;
        }));
    acc_index_[acc.get()] = index;
    accumulators_.push_back(std::move(acc));
  }
}

void GradHooks::on_gradient(int p) {
  try {
    take_grad(p);
    take_launches_(engine_.mark_ready(p));
  } catch (...) {
    // Exceptions do not cross the autograd engine intact; rethrown after backward.
    std::lock_guard<std::mutex> lock(error_mu_);
    if (!error_) error_ = std::current_exception();
  }
}

void GradHooks::deliver(const std::vector<std::pair<int, torch::Tensor>>& grads, bool lasts_window) {
  torch::NoGradGuard no_grad;
  plane_.on_compute_stream([&] {
    for (const auto& [p, g] : grads) {
      torch::Tensor& t = groups_[p].tensor;
      if (t.grad().defined()) t.mutable_grad().add_(g);
      else t.mutable_grad() = lasts_window && g.is_contiguous() ? g : g.clone(torch::MemoryFormat::Contiguous);
      on_gradient(p);
    }
  });
}

void GradHooks::rethrow_error() {
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    std::swap(e, error_);
  }
  if (e) std::rethrow_exception(e);
}

// The first gradient of a window in an overwrite group is a tensor of its own (autograd's); it
// is copied into the bucket, on the compute stream that the bucket's allreduce is ordered after,
// and .grad becomes the bucket view, which later micro-steps accumulate into.
void GradHooks::take_grad(int i) {
  auto& p = groups_[i].tensor;
  if (adopted_[static_cast<size_t>(i)]) {
    adopt_grad(i);
    return;
  }
  if (modes_[static_cast<size_t>(groups_[i].group)] != comm::GradMemory::overwrite) return;
  const torch::Tensor& g = p.grad();
  const torch::Tensor& view = views_[static_cast<size_t>(i)];
  if (!g.defined() || g.data_ptr() == view.data_ptr()) return;
  plane_.on_compute_stream([&] { view.copy_(g); });
  p.mutable_grad() = view;
}

// A world of one (GradMemory::adopted): autograd's own tensor stays the gradient, as in a plain
// loop (AccumulateGrad steals backward's result, so no pass copies it; later micro-steps add into
// it in place); the engine and the optimizer read it where it is.
void GradHooks::adopt_grad(int i) {
  auto& p = groups_[i].tensor;
  if (!p.grad().is_contiguous() || p.grad().scalar_type() != torch::kFloat32)  // not autograd's usual layout
    p.mutable_grad() = p.grad().to(torch::kFloat32).contiguous();
  const torch::Tensor& g = p.grad();
  engine_.adopt(i, g.data_ptr<float>());
  std::lock_guard<std::mutex> lock(adopted_mu_);
  if (adopted_now_.empty() || adopted_now_.back() != i) adopted_now_.push_back(i);
}

// The last window's adopted gradients go now, before forward, as zero_grad(set_to_none) drops
// a plain loop's: the allocator reuses their memory for this window's activations.
void GradHooks::start_window() {
  for (int i : overwrite_params_) groups_[i].tensor.mutable_grad().reset();
  std::lock_guard<std::mutex> lock(adopted_mu_);
  for (int i : adopted_now_) groups_[i].tensor.mutable_grad().reset();
  adopted_now_.clear();
}

void GradHooks::end_window() {
  for (int i : overwrite_params_) groups_[i].tensor.mutable_grad() = views_[static_cast<size_t>(i)];
}

void GradHooks::set_trained(const std::vector<uint8_t>& trained) {
  for (size_t g = 0; g < requires_grad_.size(); ++g) {
    const uint8_t want = trained[g];
    if (want == requires_grad_[g]) continue;
    for (int p : groups_.members[g]) groups_[p].tensor.requires_grad_(want != 0);
    requires_grad_[g] = want;
  }
}

std::vector<uint8_t> GradHooks::discover_groups(const torch::Tensor& loss) const {
  std::vector<uint8_t> found(static_cast<size_t>(groups_.num_groups()), 0);
  std::vector<torch::autograd::Node*> stack;
  std::set<torch::autograd::Node*> seen;
  if (loss.grad_fn()) stack.push_back(loss.grad_fn().get());
  while (!stack.empty()) {
    auto* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    auto it = acc_index_.find(node);
    if (it != acc_index_.end()) found[static_cast<size_t>(groups_[it->second].group)] = 1;
    for (const auto& edge : node->next_edges())
      if (edge.function) stack.push_back(edge.function.get());
  }
  return found;
}

}  // namespace thetad::daemon
