// The resident home's replicas under the replica rule (daemon/plan/replica_plan.hpp;
// docs/architecture.md, "Who holds a group's current values"): at each window's start it moves
// the state of stale groups to where the window needs it and tells the engine which groups their
// one trainer keeps; before an update it says whether this rank steps the group; before a
// checkpoint, the final hash or an export it makes every replica current. Every rank makes the
// same calls in the same order: the moves are collectives or send/recv pairs on the data plane.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/engine.hpp"
#include "config/job.hpp"
#include "daemon/observe/metrics.hpp"
#include "daemon/plan/replica_plan.hpp"
#include "daemon/observe/timeline.hpp"
#include "daemon/device/data_plane.hpp"

namespace thetad::daemon {

class ResidentReplicas {
 public:
  // A group's state tensors in a fixed order (its values, then its optimizer moments where the
  // optimizer has them), created where missing; they must stay where they are (moved into).
  using StateOf = std::function<std::vector<torch::Tensor>(int group)>;

  // `keepable` (per group): the resident groups the rule applies to; `state_numel` (per group): the
  // elements state_of gives (asked only of the ranks a move involves).
  ResidentReplicas(const config::Job& job, const DataPlane& plane, comm::Engine& engine, WindowPlans& plans,
                   std::vector<uint8_t> keepable, std::vector<int64_t> state_numel, StateOf state_of,
                   Timeline* timeline);

  bool applies(int g) const { return keepable_[static_cast<size_t>(g)] != 0; }
  // Before forward: the window's moves, then engine.keep for the groups kept.
  void start_window(int64_t step);
  // Before group g's update (every rank, once the counts have landed): moves the state if the
  // counts overruled the decision; false where another rank kept the gradient (not stepped here).
  bool before_update(int g);
  // This rank's replica of g is stale now (its buckets must not be stepped as they land).
  bool stale_here(int g) const;
  // Every replica current: one broadcast per stale group, from its holder.
  void make_current();
  // Bytes and moves of state since the last record.
  void add_stats(StepRecord& rec);

 private:
  void move(const StateMove& m);

  const config::Job& job_;
  const DataPlane& plane_;
  comm::Engine& engine_;
  const std::vector<uint8_t> keepable_;
  const std::vector<int64_t> state_numel_;
  const StateOf state_of_;
  Timeline* const timeline_;  // each move on the comm lane (null: none)
  ReplicaPlan plan_;
  ReplicaHolders holders_;
  int64_t step_ = -1;
  int64_t moved_bytes_ = 0;
  int64_t moves_ = 0;
};

}  // namespace thetad::daemon
