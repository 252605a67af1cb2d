// The row shards of offloaded row-chunked groups (the model's ShardSource), acquired from the
// store as the model streams them and released once their compute is queued. Their gradients
// accumulate shard by shard in tensors of their own over an optimizer window; in its last
// micro-step each one is handed over (to the engine, which reduces it and copies it to the
// host) as soon as backward has queued it, so the whole gradient never exists on the device.
// Included by store_home.cpp only.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>

#include "daemon/models/model.hpp"
#include "offload/param_store.hpp"

namespace thetad::daemon {

class StoreChunks : public ShardSource {
 public:
  using HandOver = std::function<void(int unit, torch::Tensor grad)>;
  using Throttle = std::function<void(size_t bytes)>;  // before a new gradient buffer
  StoreChunks(offload::ParamStore& store, torch::Device device, HandOver hand_over, Throttle throttle)
      : store_(store), device_(device), hand_over_(std::move(hand_over)), throttle_(std::move(throttle)) {}
  void set_step(int64_t step) { step_ = step; }
  // Whether the coming backward is the window's last (gradients are handed over in it).
  void set_last(bool last) { last_ = last; }
  torch::Tensor grad_chunk(int task, int k) override {
    torch::Tensor& g = grads_[unit(task, k)];
    if (!g.defined()) {
      const offload::UnitInfo& info = store_.plan().unit(unit(task, k));
      throttle_(info.numel * sizeof(float));
      g = torch::zeros({static_cast<int64_t>(info.rows), static_cast<int64_t>(info.row_elems)},
                       torch::TensorOptions().dtype(torch::kFloat32).device(device_));
    }
    return g;
  }
  // Backward is done with chunk k (it got rows of gradient or none): in the window's last
  // backward the shard is handed over, or marked absent where no micro-step gave it a gradient.
  void grad_done(int task, int k) override {
    if (last_) hand_over(unit(task, k));
  }
  // The window's last micro-step computes nothing for this task (it ran in earlier ones only,
  // or it is declared with no rows): its shards are final, hand them over before backward.
  void hand_over_task(int task) {
    for (int u : store_.plan().units_of(task + 1)) hand_over(u);
  }
  // After the last backward: what it did not hand over (none where every chunk of the window's
  // tasks reached grad_done or hand_over_task; kept as the safe default).
  void hand_over_rest() {
    while (!grads_.empty()) hand_over(grads_.begin()->first);
  }
  int num_chunks(int task) override { return static_cast<int>(store_.plan().units_of(task + 1).size()); }
  torch::Tensor chunk(int task, int k) override {
    const int u = unit(task, k);
    const offload::UnitInfo& info = store_.plan().unit(u);
    return torch::from_blob(store_.acquire(u, step_),
                            {static_cast<int64_t>(info.rows), static_cast<int64_t>(info.row_elems)},
                            torch::TensorOptions().dtype(torch::kFloat32).device(device_));
  }
  void done(int task, int k) override { store_.release(unit(task, k)); }

 private:
  int unit(int task, int k) const { return store_.plan().units_of(task + 1).at(static_cast<size_t>(k)); }
  // Hands shard u's gradient of the window over, or, where it has none, an undefined tensor
  // (the engine reduces zeros for it).
  void hand_over(int u) {
    torch::Tensor g;
    auto it = grads_.find(u);
    if (it != grads_.end()) {
      g = std::move(it->second);
      grads_.erase(it);
    }
    hand_over_(u, std::move(g));
  }
  offload::ParamStore& store_;
  torch::Device device_;
  HandOver hand_over_;
  Throttle throttle_;
  int64_t step_ = 0;
  bool last_ = true;
  std::map<int, torch::Tensor> grads_;  // unit -> its gradient so far in this window
};

}  // namespace thetad::daemon
