// The shared trunk Θ streamed from a host store of its own (offload.shared: stream): one store
// group per trunk layer, brought onto the device layer by layer as forward (and then backward, in
// reverse) reaches it, with the next offload.shared_prefetch_layers layers copied ahead while the
// current one computes. The layers' gradients are summed per backward as the trunk layer function
// hands them over, reduced by the engine in Θ's ordinary buckets, copied to the host as each bucket
// lands, and stepped there by each layer's owner with CPU AdamW. It implements the trunk layer
// function's LayerWeights (daemon/ops/trunk_layer.hpp).
//
// offload.shared_device_layers: the lowest N layers stay on the device instead, in the store's
// device cache (a line each: values and Adam moments), and are updated there by the device AdamW
// after backward; nothing of theirs crosses PCIe. The lowest ones, because the next forward needs
// layer 0 first while its gradient lands last: on the device its update is a kernel, not a CPU
// pass behind the rest of the queue; the upper layers' CPU updates run during that forward.
//
// offload.shared_split_layers: of the streamed layers, the lowest S are updated on the device
// within each step (the split of the optimizer work, offload/update_split.hpp): as its reduced
// gradient lands, such a layer's values and Adam moments come into one of the store's update
// lines (prefetched during backward), the device AdamW steps it there, and the line goes back to
// the host arena on the D2H stream; the host's CPU AdamW steps the others. Where the step's update
// is not known before backward, every streamed layer takes the CPU path that step.
//
// Θ's device memory: (prefetch + 2) layer slots for the weights, no Adam moments, plus N lines
// and, with a split, (prefetch + 2) update lines; the reduced gradient keeps Θ's resident buckets
// (same buckets, same sums: bitwise the resident result). N and S are resolved once, at build
// (streamed_placement.cpp).
#pragma once

#include <torch/torch.h>

#include <array>
#include <memory>
#include <optional>
#include <vector>

#include "comm/engine.hpp"
#include "config/job.hpp"
#include "daemon/observe/timeline.hpp"
#include "daemon/device/data_plane.hpp"
#include "daemon/models/model.hpp"
#include "daemon/models/param_groups.hpp"
#include "daemon/ops/trunk_layer.hpp"
#include "daemon/homes/group_home.hpp"
#include "daemon/homes/store_home.hpp"
#include "daemon/optim/device_adam.hpp"
#include "daemon/optim/optimizer.hpp"
#include "daemon/homes/store_home.hpp"
#include "offload/device.hpp"
#include "offload/param_store.hpp"
#include "offload/update_split.hpp"

namespace thetad::daemon {

class LineViews;

class StreamedTrunk final : public GroupHome, public LayerWeights {
 public:
  // Θ must be the trunk layers trunk.<i>.weight, trunk.<i>.bias (multitask_mlp; validate checks).
  // Built, it gives `model` its layers (TaskModel::set_layer_weights).
  StreamedTrunk(const config::Job& job, TaskModel& model, ParamGroups& groups, const DataPlane& plane,
                DeviceAdam& adam, Timeline* timeline);
  ~StreamedTrunk() override;
  StreamedTrunk(const StreamedTrunk&) = delete;
  StreamedTrunk& operator=(const StreamedTrunk&) = delete;

  int layers() const { return static_cast<int>(layer_params_.size()); }
  // Device memory the layers kept on the device will take (offload.shared_device_layers lines of
  // the largest layer's values and moments), known before build.
  size_t device_cache_bytes() const;
  // How many of the lowest layers stay on the device (offload.shared_device_layers, auto resolved).
  int64_t device_layers() const;
  // How many streamed layers are updated on the device (offload.shared_split_layers; after build).
  int64_t split_layers() const { return split_; }
  const char* kind() const override { return "streamed trunk"; }
  // Θ keeps its resident buckets (copied into on a window's first backward: overwrite).
  comm::GradMemory grad_memory(int g) const override {
    (void)g;
    return comm::GradMemory::overwrite;
  }
  // Builds the store (collective over the host's ranks) on the θ[t] store's copy device
  // (setup.copy_device: both stores share the H2D and D2H streams) or, without one, a device of
  // its own; each layer's owner writes its values into the arena from the model's tensors, which
  // then become placeholders, and the model's trunk reads its layers from here.
  void build(HomeSetup& setup) override;

  // Start of optimizer step `step` (its window) and of each micro-step's forward. Where the
  // step's update is known before backward (no skip_step, no clipping), each layer's CPU AdamW
  // is submitted as soon as its reduced gradient is pushed, during backward, instead of after.
  void start_window(const WindowPlan& plan, const WindowSettings& w) override;
  void start_micro(const StepPlan& plan) override;
  // comm.active: discover: the trunk ran with gradients for Θ in this micro-step's forward (its
  // placeholders are not in the graph).
  void add_reached(std::vector<uint8_t>& found) const override {
    if (reached_) found[0] = 1;
  }

  // LayerWeights (the trunk layer function, forward and backward).
  std::pair<torch::Tensor, torch::Tensor> acquire(int layer, bool backward) override;
  void release(int layer) override;
  void grad(int layer, const torch::Tensor& dW, const torch::Tensor& db) override;
  bool wants_grad(int layer) override {
    (void)layer;
    return trained_;
  }

  // From the engine's launch of one of Θ's buckets: its reduced values go to the layers' owners'
  // landing areas on the D2H stream once the allreduce is done.
  void on_bucket_launch(const comm::Launched& l) override;
  // After finish_backward: the pushes that waited for the buckets (synchronous copies).
  void after_reduce() override;
  // Every rank, in a step where Θ was trained: every layer not stepped early is stepped (the
  // device's layers by the device AdamW; the others by their owners' CPU AdamW).
  void step(int g, const AdamSettings& s) override;
  // A step where Θ is not updated: the pushed copies are forgotten.
  void skip(int g) override;
  void release_step(int64_t step) override;

  HomeMemory device_memory() const override;
  void add_stats(StepRecord& rec) override;
  // Checkpoints, resume and the hash: Θ in group 0's flat layout (layers concatenated).
  GroupState state(int g) override;
  void restore(int g, const GroupState& st) override;
  bool on_device(int g) const override {
    (void)g;
    return false;
  }
  // Parameter p's (of group 0) current values in the arena, read-only (see ParamStore::group_params).
  const float* host_values(int p) override;

 private:
  struct Layer {
    int w = -1, b = -1;  // parameter indices
    size_t w_numel = 0, b_numel = 0;
  };
  int unit(int layer) const { return store_->plan().units_of(layer + 1).at(0); }
  bool layer_on_device(int layer) const { return store_->cache().cached(layer + 1); }
  // Updated on the device through an update line this step (the split).
  bool split_now(int layer) const {
    return early_ && layer >= device_layers_ && layer < device_layers_ + split_;
  }
  bool wants_split() const;
  offload::StepInput split_model_input(const offload::UpdateBandwidths& bw) const;
  void resolve_split();
  void prefetch_update_line(int layer);
  void update_split_layer(int layer);
  size_t offset_in_layer(int p) const;
  size_t line_bytes() const;  // one device layer's values and Adam moments (the largest layer's)
  void hold(int layer, bool order);
  void commit(int layer);
  void push_bucket(int b, const float* data, bool trained, comm::Work* work);
  void step_layer(int layer, const offload::AdamHyper& h);
  void step_on_device(const AdamSettings& s);

  const config::Job& job_;
  TaskModel& model_;
  ParamGroups& groups_;
  const DataPlane& plane_;
  DeviceAdam& adam_;
  Timeline* timeline_;
  comm::Engine* engine_ = nullptr;
  comm::LaunchHandler take_launches_;  // the buckets our hand-overs launch, to their homes
  std::unique_ptr<offload::Device> own_device_;
  std::unique_ptr<LineViews> line_views_;  // the device layers' lines, as tensors
  std::unique_ptr<offload::ParamStore> store_;
  std::vector<Layer> layer_params_;
  std::vector<int> layer_of_;        // per parameter: its trunk layer (-1: not Θ)
  int64_t prefetch_ = 1;
  mutable int64_t device_layers_ = -1;  // device_layers(), once resolved
  int64_t step_ = 0;
  bool trained_ = true;
  bool reached_ = false;
  std::vector<uint8_t> held_;        // per layer: acquired from the store (pinned) in this step
  std::vector<float*> slot_;         // per layer: its device slot while held
  std::vector<int> forwards_;        // per layer: forward passes in this micro-step
  std::vector<int> backwards_;       // per layer: gradients handed over in this backward
  std::vector<uint8_t> written_;     // per layer: its bucket region got a gradient this window
  std::vector<int> pushed_;          // per layer: parameters whose reduced gradient was pushed this window
  std::vector<uint8_t> stepped_;     // per layer: its update submitted this window
  int64_t split_ = 0;                // offload.shared_split_layers, resolved
  std::vector<std::array<const float*, 2>> split_grad_;  // per layer: its reduced W and b gradients (split)
  std::optional<AdamSettings> early_;  // this window's settings, if known before backward
  std::vector<std::pair<torch::Tensor, torch::Tensor>> sum_;  // per layer: this backward's sum
  std::vector<std::pair<int, const float*>> deferred_;  // host device: buckets pushed after the reduce
  offload::StoreStats last_stats_;
};

}  // namespace thetad::daemon
