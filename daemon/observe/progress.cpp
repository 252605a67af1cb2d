// The progress line (see progress.hpp).
#include "daemon/observe/progress.hpp"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "common/log.hpp"

namespace thetad::daemon {

Progress::Progress(const config::Job& job, int rank, int64_t start_step)
    : job_(job), rank_(rank), start_step_(start_step), start_(Clock::now()), last_(start_) {}

void Progress::queued(int64_t samples_all_ranks, int64_t bytes_pruned) {
  samples_ += samples_all_ranks;
  bytes_pruned_ += bytes_pruned;
}

void Progress::finished(const StepRecord& rec) {
  if (rank_ != 0) return;
  const int64_t step = rec.step;
  const double since = std::chrono::duration<double>(Clock::now() - last_).count();
  const bool last = step + 1 == job_.steps;
  if (!last && since < job_.log.progress_every_s) return;
  last_ = Clock::now();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  const int64_t done = step + 1 - start_step_;
  const double eta = done > 0 ? elapsed / done * (job_.steps - step - 1) : 0;
  std::ostringstream os;
  os << "step " << step + 1 << "/" << job_.steps << " | " << std::fixed << std::setprecision(0)
     << (elapsed > 0 ? samples_ / elapsed : 0) << " samples/s | loss " << std::setprecision(4) << rec.loss;
  // Every rank's tasks (rank 0's record gathers them); a step of many tasks shows the first ones.
  const size_t shown = std::min(rec.task_loss.size(), kProgressTasks);
  for (size_t i = 0; i < shown; ++i) os << " t" << rec.task_loss[i].task << "=" << rec.task_loss[i].loss;
  if (shown < rec.task_loss.size()) os << " (+" << rec.task_loss.size() - shown << " tasks: metrics.path)";
  os << " | ETA " << std::setprecision(1) << eta << " s | pruned " << std::setprecision(2)
     << bytes_pruned_ / 1e6 << " MB";
  THETAD_LOG(info, "train") << os.str();
}

}  // namespace thetad::daemon
