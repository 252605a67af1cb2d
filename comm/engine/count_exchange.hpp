// The engine's count exchange: before backward, an async int32 SUM of per-group flags tells every
// rank how many ranks used each group (its contributors) and, for a group exactly one rank used,
// which rank that was (the root of a broadcast). Not thread-safe: the engine calls it with its
// lock held.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"

namespace thetad::comm::engine_detail {

class CountExchange {
 public:
  // `comm` carries the exchange (EngineOptions::count_comm, else the gradients' communicator).
  CountExchange(Communicator& comm, int num_groups, std::chrono::milliseconds timeout);

  // Starts the exchange of this rank's active groups; `rank` is this rank in the gradients'
  // communicator.
  void begin(const std::vector<uint8_t>& local_active, int rank, int64_t step);
  // Fetches the counts once the exchange has landed; with `block`, waits for it. False while it
  // has not landed (or not begun).
  bool fetch(bool block);
  // Forgets this window's exchange.
  void reset();

  bool ready() const { return ready_; }
  // Whether an exchange was posted and has not completed (its result may still be written).
  bool in_flight() const { return work_ && !work_->is_completed(); }
  // Per group, after fetch: ranks that used it.
  const std::vector<int32_t>& counts() const { return counts_; }
  // Per group, after fetch: the one rank that used it, -1 if not exactly one.
  int only_root(int group) const { return only_root_[static_cast<size_t>(group)]; }
  // The exchange's latency: the communicator's, else as observed by fetch; -1 unknown.
  double latency_ms() const;

 private:
  using Clock = std::chrono::steady_clock;
  Communicator& comm_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<void> buf_;  // int32[2 x num_groups] in the communicator's memory
  WorkPtr work_;
  bool ready_ = false;
  std::vector<int32_t> counts_;
  std::vector<int> only_root_;
  Clock::time_point start_;
  double observed_ms_ = -1;
};

}  // namespace thetad::comm::engine_detail
