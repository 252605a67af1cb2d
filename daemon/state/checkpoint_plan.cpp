// The plan of an incremental checkpoint (see checkpoint_plan.hpp).
#include "daemon/state/checkpoint_plan.hpp"

#include <algorithm>

#include "common/errors.hpp"

namespace thetad::daemon {
namespace {

// Each group's run file (an index into m.files, or kRunInitial / kRunInitFrom).
std::vector<int64_t> file_per_group(const Manifest& m) {
  std::vector<int64_t> at(static_cast<size_t>(m.num_groups), kRunInitial);
  for (const ManifestRun& r : m.runs)
    std::fill(at.begin() + r.first, at.begin() + r.first + r.count, r.file);
  return at;
}

int64_t run_code(GroupSource s) { return s == GroupSource::init_from ? kRunInitFrom : kRunInitial; }

}  // namespace

CheckpointPlan plan_checkpoint(const CheckpointPlan* prev, const std::vector<int64_t>& group_bytes,
                               const std::vector<int64_t>& steps, const std::vector<GroupSource>& source) {
  const size_t n = group_bytes.size();
  THETAD_CHECK(steps.size() == n && source.size() == n, InternalError, "checkpoint plan: ", n, " groups");
  if (prev && prev->manifest.num_groups != static_cast<int64_t>(n)) prev = nullptr;  // another model: no sharing
  CheckpointPlan p;
  p.steps = steps;
  if (prev) p.prev_dir = prev->dir;
  p.manifest.num_groups = static_cast<int64_t>(n);
  std::vector<int64_t> at(n, kRunInitial);  // the new manifest's file (or code) per group
  std::vector<int64_t> keep(n, -1);         // prev's file a group may stay in
  const std::vector<int64_t> prev_at = prev ? file_per_group(prev->manifest) : std::vector<int64_t>();
  std::vector<int64_t> live;  // per prev file: bytes of groups that stay current in it
  if (prev) live.assign(prev->manifest.files.size(), 0);
  for (size_t g = 0; g < n; ++g) {
    if (source[g] != GroupSource::values) {
      at[g] = run_code(source[g]);
      continue;
    }
    const bool damaged = prev && prev_at[g] >= 0 && static_cast<size_t>(prev_at[g]) < prev->damaged.size() &&
                         prev->damaged[static_cast<size_t>(prev_at[g])];
    if (prev && prev_at[g] >= 0 && prev->steps[g] == steps[g] && !damaged) {
      keep[g] = prev_at[g];
      live[static_cast<size_t>(prev_at[g])] += group_bytes[g];
    }
  }
  // Prev's files: shared whole while at least half their bytes are current; else rewritten.
  std::vector<int64_t> new_index(live.size(), -1);
  int64_t next_number = 0;
  for (size_t f = 0; prev && f < live.size(); ++f) {
    const ManifestFile& mf = prev->manifest.files[f];
    int64_t number = 0;
    if (parse_file_name(mf.file, &number)) next_number = std::max(next_number, number + 1);
    if (live[f] == 0) continue;
    if (2 * live[f] < mf.bytes) {
      ++p.compacted_files;
      continue;
    }
    new_index[f] = static_cast<int64_t>(p.manifest.files.size());
    p.manifest.files.push_back(mf);
    p.shared_bytes += mf.bytes;
    ++p.shared_files;
  }
  // The rest, in group order, into new files.
  std::vector<int64_t> open;  // groups of the file being filled
  int64_t open_bytes = 0;
  const auto close = [&] {
    if (open.empty()) return;
    const int64_t index = static_cast<int64_t>(p.manifest.files.size());
    p.manifest.files.push_back({shard_file_name(next_number++), open_bytes, 0});
    for (int64_t g : open) at[static_cast<size_t>(g)] = index;
    p.written.push_back(static_cast<size_t>(index));
    p.written_groups.push_back(open);
    p.written_bytes += open_bytes;
    open.clear();
    open_bytes = 0;
  };
  for (size_t g = 0; g < n; ++g) {
    if (source[g] != GroupSource::values) continue;
    if (keep[g] >= 0 && new_index[static_cast<size_t>(keep[g])] >= 0) {
      at[g] = new_index[static_cast<size_t>(keep[g])];
      continue;
    }
    if (!open.empty() && (static_cast<int64_t>(open.size()) >= kShardMaxGroups || open_bytes + group_bytes[g] > kFileMaxBytes))
      close();
    open.push_back(static_cast<int64_t>(g));
    open_bytes += group_bytes[g];
    if (g == 0) close();  // Θ changes at every step it trains: a file of its own, never stale tasks' bytes
  }
  close();
  for (size_t g = 0; g < n; ++g) {
    const int64_t group_steps = at[g] < 0 ? 0 : steps[g];  // groups stored nowhere were never trained
    if (!p.manifest.runs.empty() && p.manifest.runs.back().file == at[g] && p.manifest.runs.back().steps == group_steps) {
      ++p.manifest.runs.back().count;
      continue;
    }
    p.manifest.runs.push_back({static_cast<int64_t>(g), 1, at[g], group_steps});
  }
  return p;
}

std::shared_ptr<CheckpointPlan> plan_of_read(const Manifest& m, const std::string& dir, std::vector<int64_t> steps) {
  auto p = std::make_shared<CheckpointPlan>();
  p->manifest = m;
  p->dir = dir;
  p->steps = std::move(steps);
  return p;
}

}  // namespace thetad::daemon
