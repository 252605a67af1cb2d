// Checkpoints: a directory per step, `step-00000040/` with manifest.json and one file per group
// (`group-0003.pt`, a dict of tensors that Python's torch.load reads). Written under a temporary
// name by the ranks that own the groups, each file synced to disk, and renamed (then the rename
// synced) once all have finished, so a directory named step-* is always complete, also after a
// crash of the machine. Keep-N pruning runs after that and never removes the new checkpoint.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "daemon/models/param_groups.hpp"

namespace thetad::daemon {

struct CheckpointInfo {
  std::string path;
  int64_t step = 0;  // completed steps
};

// Newest complete checkpoint under dir, if any.
std::optional<CheckpointInfo> find_latest_checkpoint(const std::string& dir);
// The directory of the checkpoint after `step` completed steps.
std::string checkpoint_path(const std::string& dir, int64_t step);

// A fresh start (--no-resume) in a directory holding checkpoints: moves them into
// dir/previous-<UTC time>/ so that a later resume cannot pick another run's newer step, and
// keep-N pruning never touches them. Returns that directory ("" when nothing was moved).
std::string set_aside_checkpoints(const std::string& dir);

// Writes this rank's share of a checkpoint. `barrier` is a collective barrier across ranks;
// `all_ok` an agreement that every rank succeeded. Returns the final directory.
struct CheckpointWriter {
  std::string dir;
  int64_t step = 0;
  int rank = 0, world = 1;
  std::string job_name, job_hash;
  int64_t keep = 3;
  std::function<void()> barrier;
  std::function<bool(bool)> all_ok;
};
std::string write_checkpoint(const CheckpointWriter& w, int num_groups,
                             const std::function<GroupState(int group)>& group_state);

// Loads one group of a checkpoint (every rank loads every group: groups are replicated, so a
// checkpoint resumes on any world size). Checks the job hash (unless expected_job_hash is empty);
// ConfigError on a mismatch.
GroupState load_group(const CheckpointInfo& ckpt, int group, const std::string& expected_job_hash);

}  // namespace thetad::daemon
