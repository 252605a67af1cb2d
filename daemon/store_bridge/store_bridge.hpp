// The bridge between the model and the host-resident parameter store (offload.enabled): it
// builds the store from the model's task groups, points θ[t]'s tensors at device slots for the
// steps that use them, sends each offloaded bucket's reduced gradient to the host as its
// allreduce lands, streams the row shards of huge output layers through the engine, and asks
// the owner ranks to step the groups on the CPU. Θ (group 0) never goes through it.
//
// Set-up order (the trainer's): plan_shards (before the bucket plan) -> engine_options ->
// the engine -> build (the store; moves θ[t] off the device) -> the hooks.
#pragma once

#include <torch/torch.h>

#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/bucket_plan.hpp"
#include "comm/engine.hpp"
#include "config/job.hpp"
#include "daemon/core/schedule.hpp"
#include "daemon/core/timeline.hpp"
#include "daemon/device/data_plane.hpp"
#include "daemon/models/param_groups.hpp"
#include "daemon/optim/optimizer.hpp"
#include "offload/device.hpp"
#include "offload/param_store.hpp"

namespace thetad::daemon {

class StoreChunks;

// The store's traffic since the previous call (per-step metrics).
struct StoreStepStats {
  int64_t h2d_bytes = 0, d2h_bytes = 0, swap_hits = 0, swap_misses = 0, host_pinned_bytes = 0;
  int64_t cache_loads = 0, cache_flushes = 0, device_steps = 0, streamed_steps = 0;
  double cpu_adam_ms = 0, acquire_wait_ms = 0;
};

// The store's traffic since `last` (then set to `now`).
StoreStepStats step_stats_since(const offload::StoreStats& now, offload::StoreStats& last);
// Group g's state as views of its parameters, exp_avg and exp_avg_sq in flat layout (3 tensors).
GroupState group_state_of_flat(const ParamGroups& groups, int g, const std::vector<torch::Tensor>& flat);

class StoreBridge {
 public:
  StoreBridge(const config::Job& job, TaskModel& model, ParamGroups& groups, const DataPlane& plane,
              Timeline* timeline);
  ~StoreBridge();
  StoreBridge(const StoreBridge&) = delete;
  StoreBridge& operator=(const StoreBridge&) = delete;

  // Whether group g lives in the store (every task group; never Θ).
  bool offloaded(int g) const { return g > 0; }

  // Before the bucket plan: an offloaded row-chunked group is planned by the store's row
  // shards, one engine parameter and bucket each (appended to `infos`); the matrix itself
  // becomes a placeholder without a bucket.
  void plan_shards(std::vector<comm::ParamInfo>& infos);
  // The engine's gradient memory for an offloaded group: pooled (θ[t]'s gradient buffers follow
  // the active groups, not T) or, for a row-sharded one, streamed shard by shard.
  comm::GradMemory grad_memory(int g) const;
  // Scratch memory of streamed buckets that got no gradient here.
  void engine_options(comm::EngineOptions& o);
  // Builds the store (the host arena, the device slots, every group's initial values written
  // by its owner) and drops the model's own copies of θ[t].
  void build(comm::Engine& engine, const Schedule& schedule, int rank);

  // Start of step `step`: orders its compute after the previous step's gradient copies, points
  // the groups this rank uses at their device slots (and their gradients at the engine's pool),
  // and prefetches what the next steps need.
  void prepare_step(int64_t step);
  // Before each backward of the window (`last`: the window's last): shards of groups that the
  // last backward does not compute are handed over before it.
  void before_backward(bool last, const StepPlan& plan);
  // After the window's last backward: shards it did not hand over.
  void after_last_backward();
  // From the engine's launch of an offloaded group's bucket: its reduced gradient goes to the
  // host landing area (the group's owner copies).
  void on_bucket_launch(int b, int contributors, comm::Work& work, const float* data);
  // optimizer.overlap: the operands of bucket b if its group is in the device cache (its line's
  // values and moments, its reduced gradient at `data`), for a device step as its allreduce
  // lands; step_group then leaves its parameters alone. False (nothing taken) otherwise.
  bool take_cached_bucket(int b, float* data, AdamOperands& ops);
  // The optimizer step of an offloaded group (every rank): in the device cache, the device AdamW
  // on its line (clipping by the norm of its gradient there); else the owner runs CPU AdamW,
  // clipping by the norm of the gradient on the host. For a group no rank used: skip_group.
  void step_group(int g, const AdamSettings& s, double clip_norm);
  void skip_group(int g);
  void release_step(int64_t step);

  StoreStepStats step_stats();
  size_t device_slot_bytes() const;  // its slots and its cache lines (memory outside the allocator)
  // The store's device (streams, copies): Θ's streamed store shares it (after build).
  offload::Device* device() { return device_.get(); }
  // Checkpoints and the final hash read the store, not a device copy. A group the arena does
  // not hold (offload.host_groups: scheduled) is at its initial values: state says so (no
  // tensors), restore accepts it only as such, and initial_values draws a parameter's values.
  GroupState state(int g);
  void restore(int g, const GroupState& st);  // tensors in the group's parameter order
  const float* group_values(int g);           // a held group's values, flat
  bool held(int g) const;
  void initial_values(int p, float* dst) const;  // parameter p of a group not held

 private:
  size_t cache_budget() const;
  bool auto_cache_pending_ = false;  // device_cache_mb auto on a GPU: sized after the first step
  int64_t prepared_steps_ = 0;
  void step_cached(int g, AdamSettings s, double clip_norm);
  void add_line_operands(int g, int p, float* grad, AdamOperands& ops);
  void bind_group(int group, int64_t step);
  void bind_grads(int group);
  void hand_over_shard(int unit, torch::Tensor grad);
  void hand_over_idle_shards(const StepPlan& last_plan);
  std::shared_ptr<void> grad_memory(torch::Tensor t);
  void throttle_grads(size_t bytes);

  const config::Job& job_;
  TaskModel& model_;
  ParamGroups& groups_;
  const DataPlane& plane_;
  Timeline* timeline_;
  comm::Engine* engine_ = nullptr;
  const Schedule* schedule_ = nullptr;
  int rank_ = 0;
  std::unique_ptr<offload::Device> device_;
  std::unique_ptr<offload::ParamStore> store_;
  std::unique_ptr<StoreChunks> chunks_;  // row-chunked groups' shards, streamed by the model
  offload::StoreStats last_stats_;
  // Offloaded row-chunked groups: streamed through the engine shard by shard (one engine
  // parameter per store unit, after the model's parameters; the matrix itself has none).
  std::vector<uint8_t> streamed_;               // per group
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
