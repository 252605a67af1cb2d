// Checkpoints: a directory per step, `step-00000040/` with manifest.json (daemon/core/manifest.hpp:
// a checksum per file) and one file per group (`group-0003.pt`, a dict of tensors that Python's
// torch.load reads). Written under a temporary
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

#include "daemon/core/manifest.hpp"
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

// checkpoint.dir taken for one run (rank 0, before step 0): created, proven writable (a probe
// file written, synced and removed) and locked (flock on dir/.lock, held for the object's
// lifetime, released by the kernel if the process dies), so that a read-only, full or misnamed
// directory is found before any training and a second job on the same directory is refused,
// naming the holder. ConfigError naming the directory otherwise.
class CheckpointDirLock {
 public:
  CheckpointDirLock(const std::string& dir, const std::string& job_name);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  int fd_ = -1;
};

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

// Reads a checkpoint: its manifest parsed and checked once (format, step, groups, the model's
// hash; `num_groups` < 0: any count), then each group's file checked against its checksum before
// it is unpickled (every rank loads every group: groups are replicated, so a checkpoint resumes on
// any world size). Every problem is a ConfigError naming the file and, where there is one, the key.
class CheckpointReader {
 public:
  CheckpointReader(const CheckpointInfo& ckpt, int num_groups, const std::string& expected_job_hash);
  GroupState load_group(int group) const;
  const Manifest& manifest() const { return manifest_; }

 private:
  CheckpointInfo ckpt_;
  Manifest manifest_;
};

}  // namespace thetad::daemon
