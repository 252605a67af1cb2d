// libFuzzer target: a checkpoint shard's index (its "offsets" and "steps", what resume reads of a
// shard after the checksum) against its manifest entry. The input is the shard's bytes; the
// harness recomputes their checksum, as a hand edit that rewrites manifest.json would, so that
// every input reaches the checks behind it. Bytes: step, first, count, values (int64 each), then
// count + 1 offsets and count steps (int64; missing ones read as short arrays). check_shard_index
// may only accept or throw ConfigError; an accepted index must cut [0, values) into count ranges
// in order, with step counts within 0..step. An odd `first` reads the input as a format-4 file's
// index instead (check_file_index: `first` the manifest's group count, `count` groups read after
// the steps, the manifest's bytes 12 x values): an accepted one also holds count groups,
// ascending, within the group count. Anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/bucket_plan.hpp"
#include "common/errors.hpp"
#include "daemon/checkpoint_format/manifest.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t at = 0;
  const auto next = [&](int64_t& v) {
    if (at + 8 > size) return false;
    std::memcpy(&v, data + at, 8);
    at += 8;
    return true;
  };
  int64_t step = 0, first = 0, count = 0, values = 0;
  if (!next(step) || !next(first) || !next(count) || !next(values)) return 0;
  thetad::daemon::ManifestShard sh;
  sh.file = thetad::daemon::shard_file_name(0);
  sh.first = first;
  sh.count = count;
  sh.fnv1a64 = thetad::comm::fnv1a64(data, size);  // recomputed: the checksum check passes
  if (thetad::comm::fnv1a64(data, size) != sh.fnv1a64) std::abort();
  std::vector<int64_t> offsets, steps;
  const int64_t n = count > 0 && count < 4096 ? count : 4;  // how many to read (the arrays' real sizes)
  for (int64_t i = 0, v = 0; i <= n && next(v); ++i) offsets.push_back(v);
  for (int64_t i = 0, v = 0; i < n && next(v); ++i) steps.push_back(v);
  if (first & 1) {  // format 4
    std::vector<int64_t> groups;
    for (int64_t i = 0, v = 0; i < n && next(v); ++i) groups.push_back(v);
    thetad::daemon::ManifestFile f{"shard-00000.pt", values > 0 && values < (int64_t{1} << 40) ? values * 12 : 0, 0};
    try {
      thetad::daemon::check_file_index(f, values, groups, offsets, steps, first, step, "fuzz/shard-00000.pt");
    } catch (const thetad::ConfigError&) {
      return 0;
    }
    if (groups.empty() || offsets.size() != groups.size() + 1 || steps.size() != groups.size()) std::abort();
    for (size_t i = 0; i < groups.size(); ++i)
      if (groups[i] < 0 || groups[i] >= first || (i > 0 && groups[i] <= groups[i - 1])) std::abort();
    if (offsets.front() != 0 || offsets.back() != values || values * 12 != f.bytes) std::abort();
    for (int64_t s : steps)
      if (s < 0 || s > step) std::abort();
    return 0;
  }
  try {
    thetad::daemon::check_shard_index(sh, values, offsets, steps, step, "fuzz/shard-00000.pt");
  } catch (const thetad::ConfigError&) {
    return 0;
  }
  if (count < 1 || static_cast<int64_t>(offsets.size()) != count + 1 || static_cast<int64_t>(steps.size()) != count)
    std::abort();
  if (offsets.front() != 0 || offsets.back() != values) std::abort();
  for (size_t i = 0; i + 1 < offsets.size(); ++i)
    if (offsets[i] > offsets[i + 1]) std::abort();
  for (int64_t s : steps)
    if (s < 0 || s > step) std::abort();
  return 0;
}
