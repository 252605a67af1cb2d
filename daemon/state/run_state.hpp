// The run's state on disk and across ranks: where a checkpoint is agreed and written (every
// rank writes its share, all agree that all succeeded before rank 0 publishes), where a run
// resumes (rank 0 picks the step, every rank loads it), and the final parameter hash. It reads
// each group wherever it lives: the device (resident groups) or the host store (offloaded).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/bootstrap.hpp"
#include "comm/control_plane.hpp"
#include "config/job.hpp"
#include "daemon/models/param_groups.hpp"
#include "daemon/optim/resident_optimizer.hpp"
#include "daemon/state/checkpoint.hpp"
#include "daemon/store_bridge/store_bridge.hpp"
#include "daemon/store_bridge/streamed_trunk.hpp"

namespace thetad::daemon {

class RunState {
 public:
  // `store` is null without offload.
  RunState(const config::Job& job, const comm::WorldInfo& world, comm::ControlPlane& plane, ParamGroups& groups,
           ResidentOptimizer& resident, StoreBridge* store, StreamedTrunk* trunk = nullptr);

  // A fresh start (`resume` false) sets earlier checkpoints aside; a resume loads the newest
  // checkpoint rank 0 sees, so that every rank starts at the same step whatever its view of a
  // shared directory. Fills the groups' step counts; returns the first step to run.
  int64_t resume(bool resume, std::vector<int64_t>& group_steps);
  // Writes the checkpoint after `completed` steps (nothing without checkpoint.dir). Refuses
  // (Error, exit 1, on every rank) parameters that are not finite (write_checkpoint): the newest
  // checkpoint on disk then stays the last finite one.
  void checkpoint(int64_t completed, const std::vector<int64_t>& group_steps);
  // The first parameter of groups first, first + stride, ... that holds a NaN or an Inf, as
  // "parameter 'name' of group g", or "" where all are finite. Read where each group lives; a
  // pass over the parameters, so only after a non-finite loss (to say what is non-finite).
  std::string first_nonfinite_param(int first, int stride);
  // FNV-1a over every parameter's bytes in registration order, read where each lives.
  uint64_t params_hash();

 private:
  GroupState state(int g);
  std::unique_ptr<CheckpointDirLock> lock_;  // rank 0: checkpoint.dir is this run's
  const config::Job& job_;
  const comm::WorldInfo world_;
  comm::ControlPlane& plane_;
  ParamGroups& groups_;
  ResidentOptimizer& resident_;
  StoreBridge* store_;
  StreamedTrunk* trunk_;  // offload.shared: stream: Θ lives in its store
};

}  // namespace thetad::daemon
