// Manifests of formats 1 to 3 (manifest.hpp), still read: a file per group (1, 2) or shards of
// consecutive groups (3), their parsing, their JSON and a format-3 shard's index check.
#include <algorithm>
#include <iomanip>
#include <sstream>

#include "common/errors.hpp"
#include "daemon/checkpoint_format/manifest.hpp"
#include "daemon/checkpoint_format/manifest_parse.hpp"

namespace thetad::daemon {

using manifest_detail::hex16;
using manifest_detail::Json;
using manifest_detail::kMaxGroups;
using manifest_detail::OrderedJson;
using manifest_detail::Reader;

namespace {

// Format 3's "groups" and "shards": shards named shard-NNNNN.pt in order, covering every group once.
void parse_shards(const Reader& r, const Json& root, Manifest& m) {
  m.num_groups = r.integer(root, "groups", 1, kMaxGroups);
  const auto shards_at = root.find("shards");
  if (shards_at == root.end() || !shards_at->is_array()) r.fail("shards", "missing or not a list");
  const Json& shards = *shards_at;
  static const char* const kKeys[] = {"file", "first", "count", "fnv1a64", nullptr};
  int64_t next = 0;  // the first group the next shard must hold
  for (size_t i = 0; i < shards.size(); ++i) {
    const Json& n = shards[i];
    const std::string where = "shards[" + std::to_string(i) + "].";
    if (!n.is_object()) r.fail("shards[" + std::to_string(i) + "]", "not an object");
    ManifestShard sh;
    sh.file = r.text(n, "file", where);
    if (sh.file != shard_file_name(static_cast<int64_t>(i)))  // a name, never a path
      r.fail(where + "file", "'" + sh.file + "' is not " + shard_file_name(static_cast<int64_t>(i)));
    sh.first = r.integer(n, "first", 0, kMaxGroups, where);
    if (sh.first != next) r.fail(where + "first", std::to_string(sh.first) + " where the shards before end at " +
                                                      std::to_string(next) + " (shards hold the groups in order, each once)");
    sh.count = r.integer(n, "count", 1, kShardMaxGroups, where);
    if (sh.first + sh.count > m.num_groups)
      r.fail(where + "count", "groups " + std::to_string(sh.first) + ".." + std::to_string(sh.first + sh.count - 1) +
                                  " beyond groups: " + std::to_string(m.num_groups));
    sh.fnv1a64 = r.hex(n, "fnv1a64", where);
    r.only(n, kKeys, where);
    next = sh.first + sh.count;
    m.shards.push_back(sh);
  }
  if (next != m.num_groups)
    r.fail("shards", "hold groups 0.." + std::to_string(next - 1) + " of groups: " + std::to_string(m.num_groups));
}

// Formats 1 and 2's "groups": group g's file group-GGGG.pt at index g (2: with its checksum).
void parse_group_files(const Reader& r, const Json& root, Manifest& m) {
  const bool checksums = m.format != kManifestFormatV1;
  const auto groups_at = root.find("groups");
  if (groups_at == root.end() || !groups_at->is_array()) r.fail("groups", "missing or not a list");
  const Json& groups = *groups_at;
  for (size_t i = 0; i < groups.size(); ++i) {
    const Json& g = groups[i];
    const std::string where = "groups[" + std::to_string(i) + "].";
    if (!g.is_object()) r.fail("groups[" + std::to_string(i) + "]", "not an object");
    ManifestGroup mg;
    mg.group = static_cast<int>(r.integer(g, "group", 0, kMaxGroups, where));
    if (mg.group != static_cast<int>(i)) r.fail(where + "group", "groups are not listed 0, 1, 2, ... in order");
    mg.file = r.text(g, "file", where);
    if (mg.file != group_file_name(mg.group))  // a name, never a path
      r.fail(where + "file", "'" + mg.file + "' is not " + group_file_name(mg.group));
    if (checksums) {
      mg.fnv1a64 = r.hex(g, "fnv1a64", where);
      mg.has_checksum = true;
    }
    m.groups.push_back(mg);
  }
  m.num_groups = static_cast<int64_t>(m.groups.size());
}

}  // namespace

namespace manifest_detail {

void parse_legacy(const Reader& r, const Json& root, Manifest& m) {
  if (m.format == kManifestFormatV3) parse_shards(r, root, m);
  else parse_group_files(r, root, m);
}

void add_legacy(OrderedJson& root, const Manifest& m) {
  if (m.format == kManifestFormatV3) {
    root["groups"] = m.num_groups;
    OrderedJson shards = OrderedJson::array();
    for (const ManifestShard& s : m.shards)
      shards.push_back({{"file", s.file}, {"first", s.first}, {"count", s.count}, {"fnv1a64", hex16(s.fnv1a64)}});
    root["shards"] = std::move(shards);
    return;
  }
  OrderedJson groups = OrderedJson::array();
  for (const ManifestGroup& g : m.groups) {
    OrderedJson entry = {{"group", g.group}, {"file", g.file}};
    if (g.has_checksum) entry["fnv1a64"] = hex16(g.fnv1a64);
    groups.push_back(std::move(entry));
  }
  root["groups"] = std::move(groups);
}

}  // namespace manifest_detail

void check_shard_index(const ManifestShard& sh, int64_t values, const std::vector<int64_t>& offsets,
                       const std::vector<int64_t>& steps, int64_t checkpoint_step, const std::string& file) {
  const auto damaged = [&](const std::string& what) {
    throw ConfigError(file + ": " + what + " (the checkpoint is damaged; use --no-resume or another checkpoint.dir)");
  };
  // The manifest bounds these (parse_manifest); checked again so that no sum below overflows.
  if (sh.first < 0 || sh.first > kMaxGroups || sh.count < 1 || sh.count > kShardMaxGroups)
    damaged("groups " + std::to_string(sh.first) + ", count " + std::to_string(sh.count) + " out of range");
  if (static_cast<int64_t>(offsets.size()) != sh.count + 1)
    damaged("key 'offsets' is not int64 [" + std::to_string(sh.count + 1) + "]");
  if (static_cast<int64_t>(steps.size()) != sh.count) damaged("key 'steps' is not int64 [" + std::to_string(sh.count) + "]");
  for (size_t i = 0; i + 1 < offsets.size(); ++i)
    if (offsets[i] > offsets[i + 1]) damaged("key 'offsets' decreases");
  if (offsets.front() != 0 || offsets.back() != values)
    damaged("key 'offsets' does not span 'param' (" + std::to_string(values) + " values)");
  for (size_t i = 0; i < steps.size(); ++i)
    if (steps[i] < 0 || steps[i] > checkpoint_step)
      damaged("key 'steps': group " + std::to_string(sh.first + static_cast<int64_t>(i)) + ": step count " +
              std::to_string(steps[i]) + " outside 0.." + std::to_string(checkpoint_step) + " (the checkpoint's step)");
}

std::string group_file_name(int group) {
  std::ostringstream os;
  os << "group-" << std::setw(4) << std::setfill('0') << group << ".pt";
  return os.str();
}

std::vector<ManifestShard> plan_shards(const std::vector<int64_t>& group_bytes) {
  std::vector<ManifestShard> shards;
  int64_t bytes = 0;
  for (size_t g = 0; g < group_bytes.size(); ++g) {
    const bool full = !shards.empty() && (shards.back().count >= kShardMaxGroups ||
                                          bytes + group_bytes[g] > kShardMaxBytes);
    if (shards.empty() || full) {
      shards.push_back({shard_file_name(static_cast<int64_t>(shards.size())), static_cast<int64_t>(g), 0, 0});
      bytes = 0;
    }
    shards.back().count += 1;
    bytes += group_bytes[g];
  }
  return shards;
}

size_t shard_of(const Manifest& m, int64_t group) {
  const auto it = std::upper_bound(m.shards.begin(), m.shards.end(), group,
                                   [](int64_t g, const ManifestShard& s) { return g < s.first; });
  return static_cast<size_t>(it - m.shards.begin()) - 1;
}

}  // namespace thetad::daemon
