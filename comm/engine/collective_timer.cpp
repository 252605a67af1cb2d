// CollectiveTimer (see collective_timer.hpp).
#include "comm/engine/collective_timer.hpp"

namespace thetad::comm::engine_detail {

void CollectiveTimer::harvest(StepStats& stats) {
  size_t j = 0;
  for (Pending& p : pending_) {
    if (!p.work->is_completed()) {
      pending_[j++] = std::move(p);
      continue;
    }
    const double ms = p.work->elapsed_ms();
    if (ms < 0) continue;
    CollectiveTime& t = p.broadcast ? stats.broadcast_time : stats.allreduce_time;
    t.bytes += p.bytes;
    t.ms += ms;
    t.count += 1;
  }
  pending_.resize(j);
}

}  // namespace thetad::comm::engine_detail
