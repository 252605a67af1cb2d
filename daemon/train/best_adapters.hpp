// export.best: eval_loss across runs: each task's adapter at its lowest eval loss, kept in the
// checkpoint directory (best-eval/task{t}.safetensors, its loss and step in the header's
// metadata) as soon as an evaluation finds it. A resumed job, or a finished one run again to add
// export.merged_dir, exports the best of every run, not the best of its own evaluations (none:
// the last adapters replaced the best). --no-resume sets them aside with the checkpoints.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "config/job.hpp"
#include "daemon/models/param_groups.hpp"

namespace thetad::daemon {

struct BestAdapter {
  double loss = 0;
  int64_t step = -1;
  GroupState state;  // the adapter's parameters (CPU, float32), its group's names
};

class BestAdapters {
 public:
  // Without checkpoint.dir: keeps nothing (a run without checkpoints never resumes).
  explicit BestAdapters(const config::Job& job);

  // Task t's record from an earlier run, if one was found at or before `upto` (the step the run
  // resumed from: an evaluation after it did not happen in the run that goes on). A record that
  // does not fit `groups` (another model) is exit 2 naming the file.
  std::optional<BestAdapter> load(int task, const ParamGroups& groups, int64_t upto) const;
  // Task t's best now: written under a temporary name, fsynced, renamed over the earlier one.
  void save(int task, const BestAdapter& best) const;

 private:
  std::string file(int task) const;
  std::string dir_;  // "" = none
};

}  // namespace thetad::daemon
