// A step's per-task losses on their way from every rank to rank 0's metrics record and progress
// line: each rank packs the tasks it used in the step into a few words of a fixed size (so that
// one allgather on the control plane carries them; never a T-long vector), rank 0 unpacks every
// rank's and merges them into one loss per task.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "daemon/observe/metrics.hpp"

namespace thetad::daemon {

// One task's loss over `rows` rows of one rank (one micro-step, or several merged).
struct TaskRowsLoss {
  int task = 0;
  int64_t rows = 0;
  double loss = 0.0;
  // The squared norm of the task's reduced gradient where this rank alone holds it (its one
  // trainer kept it: comm.sole_user: keep), on one entry of the task; -1 elsewhere. Rank 0's
  // gradient norms need it: its own buffers of that group were never reduced.
  double kept_grad_sq = -1.0;
};

// Words of one rank's record with room for `capacity` entries: a count, then three words each.
inline size_t task_loss_words(size_t capacity) { return 1 + 3 * capacity; }

// This rank's entries as task_loss_words(capacity) words. InternalError where there are more
// entries than `capacity` or a task or row count does not fit its 32 bits.
std::vector<int64_t> pack_task_losses(const std::vector<TaskRowsLoss>& entries, size_t capacity);
// Every rank's entries from `ranks` records laid end to end (an allgather of pack_task_losses),
// rank by rank. InternalError on a record that pack_task_losses cannot have written.
std::vector<TaskRowsLoss> unpack_task_losses(const std::vector<int64_t>& words, int ranks, size_t capacity);
// One loss per task, ascending by task: a task's entries (micro-steps, ranks) averaged weighted
// by their rows, i.e. the loss over all its rows of the step when each entry is a mean over its
// rows. A task of one entry keeps its value exactly.
std::vector<TaskLoss> merge_task_losses(const std::vector<TaskRowsLoss>& entries);

}  // namespace thetad::daemon
