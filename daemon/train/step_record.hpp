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

#include "comm/control_plane.hpp"
#include "config/job.hpp"
#include "daemon/observe/metrics.hpp"
#include "daemon/observe/progress.hpp"
#include "daemon/device/data_plane.hpp"
#include "daemon/train/grad_norms.hpp"

namespace thetad::daemon {

// Phases of a step, marked on the compute stream; a mark's time is charged to its phase.
enum class Phase : int { start, forward, backward, comm, optimizer };

// One task's loss in one micro-step of this rank, still on the device.
struct TaskLossTensor {
  int task = 0;
  int64_t rows = 0;
  torch::Tensor loss;
};

struct PendingStep {
  struct DeviceMarks;
  PendingStep(int64_t step, int rank);
  ~PendingStep();
  StepRecord rec;
  std::vector<int> tasks;   // the task of each entry of losses after the first
  std::vector<int64_t> rows;  // and its rows
  GradNormParts grad;       // the reduced gradient's pieces' norms (where metrics are written; kept groups' elsewhere)
  torch::Tensor losses;     // host float32: the step's loss, then the task losses, then grad.norms
  std::unique_ptr<DeviceMarks> marks;  // GPUs: phase events and the losses' copy event
  bool written = false;     // its metrics record is out (finish ran)
};

class StepRecorder {
 public:
  // `ctrl` gathers every rank's per-task losses to rank 0; a rank uses at most `max_task_losses`
  // (task, micro-step) entries in a step.
  StepRecorder(const config::Job& job, const DataPlane& plane, comm::ControlPlane& ctrl, size_t max_task_losses);
  // Opens the metrics file (appending when the run resumed; beside it the effective job) and
  // starts the progress clock.
  void start(int64_t start_step);
  // Whether this rank writes metrics (gradient norms are taken only there).
  bool writes_metrics() const { return metrics_ != nullptr; }
  // An evaluation's record: written after the step record of its last step (step - 1), which is
  // still pending when the evaluation runs; at once where none is to come.
  void write_eval(const EvalRecord& rec);
  // Marks the end of a phase on the compute stream (GPUs; nothing elsewhere).
  void mark(PendingStep& p, Phase phase) const;
  // Starts the copy of the step's losses to the host.
  void queue_losses(PendingStep& p, const torch::Tensor& total, const std::vector<TaskLossTensor>& task_losses) const;
  // Waits for the step's device work (bounded by comm.timeout_s, never forever), fills in its
  // losses and device times, writes its metrics and the progress line.
  // `before_write` sees the finished record (losses read) before it goes to the metrics; if it
  // throws (a non-finite stop), the record is written first, then the error goes on. A step
  // already written is not written again.
  // Every rank's per-task losses of the step reach rank 0's record (task_loss) through one
  // allgather on the control plane, posted before `before_write` (whose loss check it rides
  // beside) and waited for after it. `gather` false (an error unwinding, peers maybe gone): this
  // rank's own tasks only, nothing posted.
  void finish(PendingStep& p, const std::function<void(StepRecord&)>& before_write = {}, bool gather = true);
  Progress& progress() { return *progress_; }

 private:
  void add_rates(StepRecord& rec) const;
  const config::Job& job_;
  const DataPlane& plane_;
  comm::ControlPlane& ctrl_;
  const size_t max_task_losses_;
  const int rank_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<Progress> progress_;
  std::vector<EvalRecord> evals_;  // waiting for the step record before them
  int64_t written_step_ = -1;      // the last step whose record is out
};

// Held by the step loop: when an error unwinds it (a non-finite stop, a failed checkpoint), the
// step that ran and is still pending gets its metrics record (nonfinite: 1 where it was found),
// without another agreement among the ranks (they may be gone); errors of that write are dropped.
class RecordOnError {
 public:
  RecordOnError(StepRecorder& recorder, const std::unique_ptr<PendingStep>& pending);
  ~RecordOnError();
  RecordOnError(const RecordOnError&) = delete;
  RecordOnError& operator=(const RecordOnError&) = delete;

 private:
  StepRecorder& recorder_;
  const std::unique_ptr<PendingStep>& pending_;
  int uncaught_;
};

}  // namespace thetad::daemon
