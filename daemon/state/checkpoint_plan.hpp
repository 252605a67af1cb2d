// Which files a checkpoint writes and which it shares with the newest complete one (format 6,
// checkpoint.hpp): a pure function of that checkpoint's plan and the groups' step counts now,
// the same on every rank. Torch-free.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/checkpoint_format/manifest.hpp"

namespace thetad::daemon {

// Where a group's values come from at a checkpoint.
enum class GroupSource : int8_t {
  values,     // written (or shared while unchanged)
  initial,    // at its initial values, which the model draws: no bytes (checkpoint.hpp)
  init_from,  // as model.init_from gives them, never trained: no bytes, the file's fingerprint
};

struct CheckpointPlan {
  Manifest manifest;              // format 6: files (shared ones with their checksums), runs
  std::string dir;                // this checkpoint's directory (set by the caller)
  std::string prev_dir;           // the checkpoint whose files are shared ("" : none)
  std::vector<size_t> written;    // manifest.files written now; written[k] by rank k % world
  std::vector<std::vector<int64_t>> written_groups;  // per written file: its groups, ascending
  std::vector<int64_t> steps;     // per group: its optimizer steps at this checkpoint
  int64_t written_bytes = 0, shared_bytes = 0;  // values' bytes (12 per value)
  int64_t shared_files = 0, compacted_files = 0;
  // Per manifest.files: found damaged on disk (no longer matching its checksum) when a later
  // checkpoint was to share it: never shared again, its current groups written anew instead.
  std::vector<uint8_t> damaged;
};

// The plan of the checkpoint after `step` completed steps: `group_bytes[g]` the bytes of group
// g's values and moments, `steps[g]` its step count, `source[g]` where its values come from.
// Against `prev` (the newest complete checkpoint, or null): a group whose source and step
// count are what prev recorded keeps prev's file (unless that file is damaged); prev's files that hold such a group are
// shared whole, unless less than half of a file's bytes are still current (then its current
// groups are written again, so that stale bytes do not pile up); every other group is packed,
// in group order, into new files (at most kShardMaxGroups groups and kFileMaxBytes bytes, a
// larger group alone; Θ in files of its own, as it changes whenever it trains), numbered on
// from prev's highest. Runs join consecutive groups of one file and one step count.
CheckpointPlan plan_checkpoint(const CheckpointPlan* prev, const std::vector<int64_t>& group_bytes,
                               const std::vector<int64_t>& steps, const std::vector<GroupSource>& source);

// The plan of a checkpoint read at resume (formats 5 and 6), to share its files from: its manifest,
// its directory and the groups' step counts read from it.
std::shared_ptr<CheckpointPlan> plan_of_read(const Manifest& m, const std::string& dir, std::vector<int64_t> steps);

}  // namespace thetad::daemon
