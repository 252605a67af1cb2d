// The torch side of the reducer (what c10d keeps in its Reducer): autograd post-accumulate hooks
// that hand each parameter's gradient to the engine as backward produces it, .grad as views of
// the engine's bucket buffers, which groups take gradients (frozen groups do not), and the
// discovery of the groups a loss reaches (DDP's find_unused_parameters).
#pragma once

#include <torch/torch.h>

#include <exception>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "comm/engine.hpp"
#include "daemon/device/data_plane.hpp"
#include "daemon/models/param_groups.hpp"

namespace torch::autograd {
struct Node;
}

namespace thetad::daemon {

class GradHooks {
 public:
  // `modes`: per group, how the engine holds its gradients (EngineOptions::grad_memory): owned
  // and overwrite groups' .grad is bound once here to their fixed buckets (overwrite: the first
  // gradient of a window is copied in); pooled and streamed memory is bound per window by its
  // home; a group with none has no gradient. `take_launches` gets the buckets each hook's
  // mark_ready launched (Homes::take: each to its group's home), on the hook's thread.
  GradHooks(ParamGroups& groups, comm::Engine& engine, const DataPlane& plane,
            const std::vector<comm::GradMemory>& modes, comm::LaunchHandler take_launches);
  GradHooks(const GradHooks&) = delete;
  GradHooks& operator=(const GradHooks&) = delete;

  // Before a window's first backward: overwrite groups' .grad is dropped, so autograd gives
  // each first gradient a tensor of its own, which the hook copies into the bucket; adopted
  // groups' (the last window's gradients) too.
  void start_window();
  // After the window's last backward: .grad is the bucket view again, also where no gradient
  // came (the engine zeroed it there).
  void end_window();
  // Frozen groups (used in forward, not trained) get no gradient at all: requires_grad off.
  void set_trained(const std::vector<uint8_t>& trained);
  // Groups whose parameters `loss` reaches.
  std::vector<uint8_t> discover_groups(const torch::Tensor& loss) const;
  // After backward: rethrows the first exception a hook caught (its type kept: a failed
  // collective stays a CommError, exit 3), so backward itself never unwinds through autograd.
  void rethrow_error();
  // Gradients (parameter, gradient) computed outside autograd's graph of the parameters (a pass
  // replayed from a CUDA graph: daemon/train/graphed_pass) handed over in order as autograd
  // would: each accumulated into .grad, or made .grad where it is undefined, then the hook.
  // `lasts_window`: the gradients stay as they are until the window's update has read them (its
  // last pass), so .grad may be the gradient itself; else a copy, since the next pass overwrites it.
  void deliver(const std::vector<std::pair<int, torch::Tensor>>& grads, bool lasts_window);
  // Parameter p's gradient in its bucket (resident groups).
  const torch::Tensor& view(int p) const { return views_[static_cast<size_t>(p)]; }

 private:
  void install();
  void on_gradient(int p);
  void take_grad(int p);
  void adopt_grad(int p);
  ParamGroups& groups_;
  comm::Engine& engine_;
  const comm::LaunchHandler take_launches_;
  const DataPlane& plane_;
  const std::vector<comm::GradMemory> modes_;  // per group
  std::vector<torch::Tensor> views_;      // per parameter (owned and overwrite groups)
  // The parameters of overwrite groups, which every window visits: a list of its own, since
  // 10,000 offloaded adapters are 1.28 M parameters that a loop over all of them would pass twice
  // per step.
  std::vector<int> overwrite_params_;
  std::vector<uint8_t> adopted_;          // per parameter: its group's gradients are autograd's (adopted)
  std::mutex adopted_mu_;                 // hooks may run on autograd's device threads
  std::vector<int> adopted_now_;          // parameters adopted since the window started (their .grad is reset next)
  std::vector<uint8_t> requires_grad_;    // per group, current flag
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keep the hooks alive
  std::unordered_map<const torch::autograd::Node*, int> acc_index_;
  std::mutex error_mu_;
  std::exception_ptr error_;
};

}  // namespace thetad::daemon
