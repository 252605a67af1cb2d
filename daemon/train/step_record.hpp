// The per-step record: a step's metrics while its device work is still in flight. The host
// queues step s+1 while the GPU runs step s, so a step's losses (copied back asynchronously)
// and its phase times (CUDA events on the compute stream) are read one step later, when
// finish() writes its metrics line and the progress line. On the CPU everything is final when
// the step returns.
#pragma once

#include <functional>

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "config/job.hpp"
#include "daemon/core/metrics.hpp"
#include "daemon/core/progress.hpp"
#include "daemon/device/data_plane.hpp"

namespace thetad::daemon {

// Phases of a step, marked on the compute stream; a mark's time is charged to its phase.
enum class Phase : int { start, forward, backward, comm, optimizer };

struct PendingStep {
  struct DeviceMarks;
  PendingStep(int64_t step, int rank);
  ~PendingStep();
  StepRecord rec;
  std::vector<int> tasks;   // the task of each entry of losses after the first
  torch::Tensor losses;     // host float32: the step's loss, then the task losses
  std::unique_ptr<DeviceMarks> marks;  // GPUs: phase events and the losses' copy event
};

class StepRecorder {
 public:
  StepRecorder(const config::Job& job, const DataPlane& plane, int rank);
  // Opens the metrics file (appending when the run resumed) and starts the progress clock.
  void start(int64_t start_step);
  // Marks the end of a phase on the compute stream (GPUs; nothing elsewhere).
  void mark(PendingStep& p, Phase phase) const;
  // Starts the copy of the step's losses to the host.
  void queue_losses(PendingStep& p, const torch::Tensor& total,
                    const std::vector<std::pair<int, torch::Tensor>>& task_losses) const;
  // Waits for the step's device work (bounded by comm.timeout_s, never forever), fills in its
  // losses and device times, writes its metrics and the progress line.
  // `before_write` sees the finished record (losses read) before it goes to the metrics.
  void finish(PendingStep& p, const std::function<void(StepRecord&)>& before_write = {});
  Progress& progress() { return *progress_; }

 private:
  const config::Job& job_;
  const DataPlane& plane_;
  const int rank_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<Progress> progress_;
};

}  // namespace thetad::daemon
