// The MPI backend's Work: a completion flag set by the progress thread, a condition variable the
// caller waits on, the failure to rethrow, and a callback that aborts the communicator when a
// wait times out (a timed-out collective cannot be resumed).
#pragma once

#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>

#include "comm/communicator.hpp"

namespace thetad::comm {

class MpiWork : public Work {
 public:
  using Clock = std::chrono::steady_clock;
  using OnTimeout = std::function<void(const std::string& why)>;

  MpiWork(uint64_t sequence, CollectiveTag tag, OnTimeout on_timeout);

  bool is_completed() override;
  void wait(std::chrono::milliseconds timeout) override;
  double elapsed_ms() const override;
  uint64_t sequence() const override { return sequence_; }

  // Called by the progress thread (or abort). The first of complete/fail wins.
  void complete();
  void fail(std::exception_ptr error);
  const CollectiveTag& tag() const { return tag_; }

 private:
  enum class State { pending, done, failed };
  const uint64_t sequence_;
  const CollectiveTag tag_;
  const OnTimeout on_timeout_;
  const Clock::time_point launched_ = Clock::now();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::pending;
  std::exception_ptr error_;
  Clock::time_point finished_;
};

}  // namespace thetad::comm
