// The table of where each parameter group lives: one GroupHome per kind of place, and group ->
// home, built once at set-up from the job's Placement (daemon/plan/placement: Θ resident or
// streamed, θ[t] resident or in the host store). Each bucket the engine launches goes
// straight to its group's home (take); the trainer and the run state loop over the
// groups and ask their homes. Also the groups' optimizer step counts (lazy: a group counts only
// the steps that updated it).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "comm/engine.hpp"
#include "config/job.hpp"
#include "daemon/observe/timeline.hpp"
#include "daemon/device/data_plane.hpp"
#include "daemon/homes/group_home.hpp"
#include "daemon/models/model.hpp"
#include "daemon/optim/device_adam.hpp"
#include "daemon/plan/placement.hpp"

namespace thetad::daemon {

class StreamedBase;

class Homes {
 public:
  // Builds the home of each kind `placement` names and gives it its groups; on a GPU moves the
  // resident groups' tensors there (the model is built on the host when a host store takes some
  // of its groups: placement.model_on_host).
  Homes(const config::Job& job, const Placement& placement, TaskModel& model, ParamGroups& groups,
        const DataPlane& plane, Timeline* timeline);
  ~Homes();
  Homes(const Homes&) = delete;
  Homes& operator=(const Homes&) = delete;

  // Where the model is built, before the table exists: on the host when a host store takes some
  // of its groups (θ[t] never lives on the device whole), else on the device.
  static torch::Device model_device(const Placement& placement, const DataPlane& plane);

  // The placement the table was built from.
  const Placement& placement() const { return placement_; }
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
  // The buckets a call into the engine launched, each to its group's home (GroupHome::
  // on_bucket_launch), after the engine's lock was released; from whichever thread made the call
  // (autograd's device threads included), one such call at a time.
  void take(const comm::Launches& launches);
  // take(), for the engine's callers that are not homes (the gradient hooks, the step protocol).
  comm::LaunchHandler launch_handler() {
    return [this](const comm::Launches& l) { take(l); };
  }
  // Host time in take() since the window started (for the timeline).
  double take_ms() const;

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

  // ---- a parameter's values, wherever its home keeps them (the final hash, the loss check) ----
  // Parameter p's float32 values readable on the host: in place where its home keeps a host copy
  // (no copy of θ), else the model's tensor widened (a bf16-held base) and copied to the host
  // (`keep` holds that copy).
  struct HostValues {
    const float* data = nullptr;
    torch::Tensor keep;
  };
  HostValues values_on_host(int p) const;
  // Every value of parameter p is finite (read where its home keeps it: no copy to the host).
  bool finite(int p) const;

  // Optimizer steps per group (resume sets them; checkpoints record them).
  std::vector<int64_t>& group_steps() { return group_steps_; }
  const std::vector<int64_t>& group_steps() const { return group_steps_; }

  HomeMemory device_memory() const;  // what the homes hold on the device, summed
  void add_stats(StepRecord& rec);

 private:
  void find_in_use();
  const config::Job& job_;
  const Placement placement_;
  ParamGroups& groups_;
  const DataPlane& plane_;
  Timeline* timeline_;
  DeviceAdam adam_;
  std::vector<std::unique_ptr<GroupHome>> homes_;
  std::unique_ptr<StreamedBase> streamed_base_;  // offload.shared: stream of a transformer's frozen base
  std::vector<GroupHome*> home_of_;  // per group
  std::vector<GroupHome*> in_use_;   // the homes of some group, each once, in set-up order
  comm::Engine* engine_ = nullptr;
  mutable std::mutex take_mu_;  // take() one call at a time
  double take_ms_ = 0;
  WindowSettings window_;
  std::vector<int64_t> group_steps_;
};

}  // namespace thetad::daemon
