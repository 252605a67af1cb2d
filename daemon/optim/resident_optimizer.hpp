// The optimizer of the groups that live on the device (Θ always; θ[t] without the host store):
// their Adam moments, the step of a whole group, and with optimizer.overlap on GPUs the step of
// each bucket on a side stream as soon as its allreduce lands.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "comm/engine.hpp"
#include "config/job.hpp"
#include "daemon/device/data_plane.hpp"
#include "daemon/models/param_groups.hpp"
#include "daemon/optim/optimizer.hpp"
#include "daemon/reducer/grad_hooks.hpp"

namespace thetad::daemon {

class ResidentOptimizer {
 public:
  // `resident`: per group, whether it is stepped here (the others' moments live in the host
  // store, or nowhere: a frozen base).
  ResidentOptimizer(ParamGroups& groups, const GradHooks& hooks, const comm::BucketPlan& plan,
                    const DataPlane& plane, std::vector<uint8_t> resident, const config::OptimizerConfig& opt);
  ~ResidentOptimizer();

  // optimizer.overlap takes effect: buckets are stepped as they land (GPUs only; not when
  // clipping needs the whole group's norm first).
  static bool overlaps(const DataPlane& plane, const config::OptimizerConfig& opt);
  bool overlap() const { return overlap_; }
  // Start of a step: no bucket stepped yet.
  void start_step();
  // From the engine's launch of bucket b (overlap): queues its parameters' step on the side
  // stream after the bucket's allreduce. `s` carries the group's step count for this step.
  void step_bucket(int b, int contributors, comm::Work& work, const AdamSettings& s);
  // The same for operands that live elsewhere (a device-cached θ[t]'s bucket, views of its cache
  // line): queued on the side stream after `work`, joined like the bucket steps. Overlap only.
  void step_after(comm::Work& work, AdamOperands& ops, const AdamSettings& s);
  // Before the optimizer steps the rest: the bucket steps queued so far come before the next
  // forward (the compute stream waits for the side stream).
  void join_bucket_steps();
  // Steps group g's parameters that no bucket step covered; false if there were none.
  bool step_group(int g, AdamSettings s);

  // Checkpoints: the group's parameters and moments (device tensors); restores them from a
  // state whose tensors are in the group's parameter order.
  GroupState state(int g) const;
  void restore(int g, const GroupState& st);

 private:
  void step_params(const std::vector<int>& params, AdamSettings s);
  template <typename Step>
  void on_side_after(comm::Work& work, Step&& step);
  ParamGroups& groups_;
  const GradHooks& hooks_;
  const comm::BucketPlan& plan_;
  const DataPlane& plane_;
  const std::vector<uint8_t> resident_;
  const double clip_norm_;
  bool overlap_ = false;
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_;  // per parameter (resident groups)
  std::vector<uint8_t> bucket_stepped_;              // per bucket, this step
  struct SideStream;
  std::unique_ptr<SideStream> side_;                 // overlap: the stream bucket steps run on
};

}  // namespace thetad::daemon
