// The progress line of rank 0 ("step 40/200 | 5120 samples/s | loss 0.3125 t0=0.31 t1=0.29 | ETA
// 12.0 s | pruned 1.20 MB"), at most every log.progress_every_s seconds and at the last step:
// rank 0's loss and the loss of each task any rank trained in the step (the first
// kProgressTasks of them).
#pragma once

#include <chrono>
#include <cstdint>

#include "config/job.hpp"
#include "daemon/observe/metrics.hpp"

namespace thetad::daemon {

constexpr size_t kProgressTasks = 16;

class Progress {
 public:
  Progress(const config::Job& job, int rank, int64_t start_step);
  // Step `step` was queued: its samples (all ranks) and pruned bytes count from now on.
  void queued(int64_t samples_all_ranks, int64_t bytes_pruned);
  // Step `rec.step` is final (its losses known): logs the line when it is time.
  void finished(const StepRecord& rec);

 private:
  using Clock = std::chrono::steady_clock;
  const config::Job& job_;
  const int rank_;
  const int64_t start_step_;
  Clock::time_point start_, last_;
  int64_t samples_ = 0;
  int64_t bytes_pruned_ = 0;
};

}  // namespace thetad::daemon
