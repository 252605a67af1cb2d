// The home of the groups that live on the device for the whole run (Θ always, unless streamed;
// θ[t] without the host store): their values are the model's tensors, their gradients the
// engine's buckets, their Adam moments device tensors created at a group's first update (as
// torch.optim does: a group never trained holds none), stepped by the device AdamW, bucket by
// bucket as allreduces land where optimizer.overlap allows. From 2 ranks on, a group one rank
// trains for a while stays current on that rank only (ResidentReplicas).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "config/job.hpp"
#include "daemon/observe/timeline.hpp"
#include "daemon/device/data_plane.hpp"
#include "daemon/homes/group_home.hpp"
#include "daemon/homes/resident_replicas.hpp"
#include "daemon/models/model.hpp"
#include "daemon/optim/device_adam.hpp"

namespace thetad::daemon {

class ResidentHome final : public GroupHome {
 public:
  // `keepable` (per group): the groups the replica rule may keep (Placement::replica_keepable).
  ResidentHome(const config::Job& job, const TaskModel& model, ParamGroups& groups, const DataPlane& plane,
               DeviceAdam& adam, Timeline* timeline, std::vector<uint8_t> keepable);
  const char* kind() const override { return "resident"; }

  comm::GradMemory grad_memory(int g) const override;
  void build(HomeSetup& setup) override;
  void start_window(const WindowPlan& plan, const WindowSettings& w) override;
  void on_bucket_launch(const comm::Launched& l) override;
  void step(int g, const AdamSettings& s) override;
  void make_current() override;
  GroupState state(int g) override;
  void restore(int g, const GroupState& st) override;
  bool on_device(int g) const override {
    (void)g;
    return true;
  }
  HomeMemory device_memory() const override;
  void add_stats(StepRecord& rec) override;

 private:
  void add_operands(int p, float* grad, AdamOperands& ops);
  void create_moments(int p);
  std::vector<torch::Tensor> replica_state(int g);
  const config::Job& job_;
  const TaskModel& model_;
  ParamGroups& groups_;
  const DataPlane& plane_;
  DeviceAdam& adam_;
  Timeline* timeline_;
  comm::Engine* engine_ = nullptr;
  const WindowSettings* window_ = nullptr;
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_;  // per parameter: created at its first update
  int64_t moment_bytes_ = 0;                         // of those, allocated so far
  std::vector<uint8_t> bucket_stepped_;              // per bucket, this window
  const std::vector<uint8_t> keepable_;              // per group: the placement's replica rule
  std::unique_ptr<ResidentReplicas> replicas_;       // null: no group follows the replica rule
};

}  // namespace thetad::daemon
