// The table of where each parameter group lives: one GroupHome per kind of place, and group ->
// home, decided once at set-up from the job (Θ: resident, or streamed with offload.shared:
// stream; θ[t]: resident, or the host store with offload.enabled). The engine hands each
// launched bucket straight to its group's home; the trainer and the run state loop over the
// groups and ask their homes. Also the groups' optimizer step counts (lazy: a group counts only
// the steps that updated it).
#pragma once

#include <memory>
#include <vector>

#include "comm/engine.hpp"
#include "config/job.hpp"
#include "daemon/observe/timeline.hpp"
#include "daemon/device/data_plane.hpp"
#include "daemon/homes/group_home.hpp"
#include "daemon/models/model.hpp"
#include "daemon/optim/device_adam.hpp"

namespace thetad::daemon {

class StoreHome;
class StreamedTrunk;

class Homes {
 public:
  // Places every group; on a GPU moves the resident groups' tensors there (the model is built on
  // the host when a host store takes some of its groups).
  Homes(const config::Job& job, TaskModel& model, ParamGroups& groups, const DataPlane& plane, Timeline* timeline);
  ~Homes();
  Homes(const Homes&) = delete;
  Homes& operator=(const Homes&) = delete;

  // Where the model is built, before the table exists: on the host when a host store takes some
  // of its groups (θ[t] never lives on the device whole), else on the device; task groups are
  // built lazily (drawn by the store, in its arena) when the store takes them.
  static torch::Device model_device(const config::Job& job, const DataPlane& plane);
  static bool lazy_tasks(const config::Job& job) { return job.offload.enabled; }

  int num_groups() const { return static_cast<int>(home_of_.size()); }
  GroupHome& of(int g) const { return *home_of_[static_cast<size_t>(g)]; }
  // A test's home for group g instead of the job's choice (before set-up).
  void place(int g, std::unique_ptr<GroupHome> home);

  // ---- set-up (the trainer's order): the bucket plan's parameters, the engine's options, then
  // build once the engine exists ----
  std::vector<comm::ParamInfo> plan_params() const;
  std::vector<comm::GradMemory> grad_memory() const;
  void engine_options(comm::EngineOptions& o);
  void build(comm::Engine& engine, WindowPlans& plans, int rank);

  // ---- a window: every home hears every phase (`plan`: this rank's, built once by the trainer) ----
  void start_window(const WindowPlan& plan, const AdamSettings& settings);
  void start_micro(const StepPlan& plan);
  void add_reached(std::vector<uint8_t>& found) const;
  void before_backward(bool last, const StepPlan& plan);
  void after_backward(bool last);
  void after_reduce();
  // The optimizer: each group some rank used (contributors != 0) is stepped in its home, unless
  // `skip` (train.on_nonfinite: skip_step: nothing is updated); the others are skipped.
  void step(const std::vector<int>& contributors, const AdamSettings& settings, bool skip);
  void release_step(int64_t step);
  // Every home's groups current on every rank (GroupHome::make_current; collective).
  void make_current();

  // Optimizer steps per group (resume sets them; checkpoints record them).
  std::vector<int64_t>& group_steps() { return group_steps_; }
  const std::vector<int64_t>& group_steps() const { return group_steps_; }

  HomeMemory device_memory() const;  // what the homes hold on the device, summed
  void add_stats(StepRecord& rec);

 private:
  void find_in_use();
  const config::Job& job_;
  TaskModel& model_;
  ParamGroups& groups_;
  const DataPlane& plane_;
  Timeline* timeline_;
  DeviceAdam adam_;
  std::vector<std::unique_ptr<GroupHome>> homes_;
  std::vector<GroupHome*> home_of_;  // per group
  std::vector<GroupHome*> in_use_;   // the homes of some group, each once, in set-up order
  StoreHome* store_ = nullptr;       // θ[t]'s host store (offload.enabled)
  StreamedTrunk* trunk_ = nullptr;   // Θ's (offload.shared: stream)
  comm::Engine* engine_ = nullptr;
  WindowSettings window_;
  std::vector<int64_t> group_steps_;
};

}  // namespace thetad::daemon
