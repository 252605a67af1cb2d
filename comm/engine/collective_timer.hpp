// The engine's record of the bandwidth its collectives achieve: each launched bucket's work, its
// payload bytes and kind, moved into a window's stats (StepStats::allreduce_time, broadcast_time)
// once the work has completed, so that a step's achieved algbw can be set beside the probe's
// (bench/comm). Never waits. Not thread-safe: the engine calls it with its lock held.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/engine.hpp"

namespace thetad::comm::engine_detail {

class CollectiveTimer {
 public:
  void launched(WorkPtr work, int64_t bytes, bool broadcast) { pending_.push_back({std::move(work), bytes, broadcast}); }
  // Adds the completed ones to `stats` and forgets them (a failed work, or one whose backend
  // cannot time it, is dropped).
  void harvest(StepStats& stats);

 private:
  struct Pending {
    WorkPtr work;
    int64_t bytes;
    bool broadcast;
  };
  std::vector<Pending> pending_;
};

}  // namespace thetad::comm::engine_detail
