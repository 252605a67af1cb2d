// The home of θ[t] in the host-resident parameter store (offload.enabled): it builds the store
// from the model's task groups, points θ[t]'s tensors at device slots, cache lines or transit
// lines for the steps that use them, sends each offloaded bucket's reduced gradient to the host
// as its allreduce lands, streams the row shards of huge output layers through the engine, and
// steps each group where its state is: on the device (a cache or transit line: the device
// AdamW) or by its owner's CPU AdamW. Θ (group 0) never lives here.
#pragma once

#include <torch/torch.h>

#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/bucket_plan.hpp"
#include "comm/engine.hpp"
#include "config/job.hpp"
#include "daemon/plan/window_plan.hpp"
#include "daemon/observe/timeline.hpp"
#include "daemon/device/data_plane.hpp"
#include "daemon/models/param_groups.hpp"
#include "daemon/homes/group_home.hpp"
#include "daemon/optim/device_adam.hpp"
#include "daemon/optim/optimizer.hpp"
#include "offload/device.hpp"
#include "offload/param_store.hpp"

namespace thetad::daemon {

class LineViews;
class StoreChunks;

// The store's traffic since `last` (then set to `now`), for the per-step metrics.
StoreTraffic traffic_since(const offload::StoreStats& now, offload::StoreStats& last);
// Group g's state as views of its parameters, exp_avg and exp_avg_sq in flat layout (3 tensors).
GroupState group_state_of_flat(const ParamGroups& groups, int g, const std::vector<torch::Tensor>& flat);

class StoreHome final : public GroupHome {
 public:
  // `unheld_tasks`: the placement's (groups the schedule never uses stay out of the arena).
  StoreHome(const config::Job& job, TaskModel& model, ParamGroups& groups, const DataPlane& plane, DeviceAdam& adam,
            Timeline* timeline, bool unheld_tasks);
  ~StoreHome() override;
  StoreHome(const StoreHome&) = delete;
  StoreHome& operator=(const StoreHome&) = delete;
  const char* kind() const override { return "host store"; }

  // Before the bucket plan: an offloaded row-chunked group is planned by the store's row
  // shards, one engine parameter and bucket each (appended to `infos`); the matrix itself
  // becomes a placeholder without a bucket.
  void plan_params(std::vector<comm::ParamInfo>& infos) override;
  // Pooled (θ[t]'s gradient buffers follow the active groups, not T) or, for a row-sharded
  // group, streamed shard by shard.
  comm::GradMemory grad_memory(int g) const override;
  // Scratch memory of streamed buckets that got no gradient here.
  void engine_options(comm::EngineOptions& o) override;
  // Builds the store (the host arena, the device slots, every group's initial values written
  // by its owner) and drops the model's own copies of θ[t].
  void build(HomeSetup& setup) override;

  // Start of the plan's step: orders its compute after the previous step's gradient copies,
  // places the step's groups in the device cache, points the groups this rank uses at their lines
  // or slots (and their gradients at the engine's pool), and prefetches what the next steps need
  // (read ahead in the run's window plans).
  void start_window(const WindowPlan& plan, const WindowSettings& w) override;
  // Before each backward of the window (`last`: the window's last): shards of groups that the
  // last backward does not compute are handed over before it.
  void before_backward(bool last, const StepPlan& plan) override;
  // After the window's last backward: shards it did not hand over.
  void after_backward(bool last) override;
  // A bucket's reduced gradient goes to the host landing area (the group's owner copies); a
  // group on a device line keeps it there (optimizer.overlap: stepped on the side stream).
  void on_bucket_launch(const comm::Launched& l) override;
  // On a device line: the device AdamW there (clipping by the norm of its gradient there); else
  // the owner runs CPU AdamW, clipping by the norm of the gradient on the host.
  void step(int g, const AdamSettings& s) override;
  void skip(int g) override;
  void release_step(int64_t step) override;

  // Checkpoints and the final hash read the store, not a device copy. A group the arena does
  // not hold (offload.host_groups: scheduled) is at its initial values: state says so (no
  // tensors), restore accepts it only as such, and initial_values draws a parameter's values.
  GroupState state(int g) override;
  void restore(int g, const GroupState& st) override;
  bool on_device(int g) const override {
    (void)g;
    return false;  // read through the store (a cached group is read from its line there)
  }
  const float* host_values(int p) override;
  bool initial(int g) const override;
  void initial_values(int p, float* dst) const override;
  // A device copy of the group's current values (the store's, once its update landed; its initial
  // values where it is not held), bound to its parameters until the function returned runs: a
  // step binds only the groups it uses, so another binding left behind would hold device memory.
  std::function<void()> lend_to_forward(int g) override;

  HomeMemory device_memory() const override;  // its slots and its lines (memory outside the allocator)
  void add_stats(StepRecord& rec) override;
  // The store's device (streams, copies): Θ's streamed store shares it (after build).
  offload::Device* device() { return device_.get(); }

 private:
  size_t cache_budget() const;
  bool auto_cache_pending_ = false;  // device_cache_mb auto on a GPU: sized after the first step
  int64_t prepared_steps_ = 0;
  void step_on_line(int g, const AdamSettings& s);
  void add_line_operands(int g, int p, float* grad, AdamOperands& ops);
  void bind_group(int group, int64_t step);
  void bind_grads(int group);
  void hand_over_shard(int unit, torch::Tensor grad);
  void hand_over_idle_shards(const StepPlan& last_plan);
  std::shared_ptr<void> keep_for_d2h(torch::Tensor t);
  void throttle_grads(size_t bytes);

  const config::Job& job_;
  const bool unheld_tasks_;
  TaskModel& model_;
  ParamGroups& groups_;
  const DataPlane& plane_;
  DeviceAdam& adam_;
  Timeline* timeline_;
  const WindowSettings* window_ = nullptr;
  comm::Engine* engine_ = nullptr;
  comm::LaunchHandler take_launches_;  // the buckets our hand-overs launch, to their homes
  WindowPlans* plans_ = nullptr;
  int rank_ = 0;
  std::unique_ptr<offload::Device> device_;
  std::unique_ptr<offload::ParamStore> store_;
  std::unique_ptr<StoreChunks> chunks_;  // row-chunked groups' shards, streamed by the model
  std::unique_ptr<LineViews> line_views_;  // groups on device lines, as tensors
  offload::StoreStats last_stats_;
  // Offloaded row-chunked groups: streamed through the engine shard by shard (one engine
  // parameter per store unit, after the model's parameters; the matrix itself has none).
  std::vector<std::vector<int>> shard_params_;  // per group: engine parameters of its shards
  std::vector<int> unit_param_;                 // per store unit: its engine parameter (or -1)
  std::vector<size_t> grad_offset_;             // per engine parameter: element offset in its group
  std::vector<uint8_t> param_stepped_;          // per model parameter: stepped as its bucket landed
  // GPUs: shard gradients launched and not yet copied out (their memory is not reusable before
  // then): at most grad_inflight_cap_ bytes before a new one is allocated (throttle_grads).
  struct InFlight;
  std::mutex inflight_mu_;
  size_t grad_inflight_cap_ = 0;
  size_t grad_inflight_bytes_ = 0;
  std::unique_ptr<InFlight> inflight_;
};

}  // namespace thetad::daemon
