// The checkpoint manifest (see manifest.hpp). JSON is YAML's flow style, so yaml-cpp reads it.
#include "daemon/core/manifest.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <limits>
#include <set>
#include <sstream>

#include "common/errors.hpp"
#include "common/text.hpp"
#include "config/job.hpp"

namespace thetad::daemon {
namespace {

constexpr int64_t kMaxGroups = int64_t{1} << 21;  // model.tasks <= 2^20, plus Θ

std::string hex16(uint64_t v) {
  std::ostringstream os;
  os << std::hex << std::setw(16) << std::setfill('0') << v;
  return os.str();
}

bool is_hex16(const std::string& s) {
  if (s.size() != 16) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// Reads manifest keys; every failure names the file and the key.
struct Reader {
  const std::string& path;
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw ConfigError(path + ": " + key + ": " + what + " (the checkpoint is damaged or not thetad's; use "
                      "--no-resume or another checkpoint.dir)");
  }
  YAML::Node need(const YAML::Node& map, const std::string& key, const std::string& where) const {
    const YAML::Node n = map[key];
    if (!n) fail(where + key, "missing");
    if (!n.IsScalar()) fail(where + key, "not a single value");
    return n;
  }
  std::string text(const YAML::Node& map, const std::string& key, const std::string& where = "") const {
    return need(map, key, where).Scalar();
  }
  int64_t integer(const YAML::Node& map, const std::string& key, int64_t lo, int64_t hi,
                  const std::string& where = "") const {
    const std::string s = need(map, key, where).Scalar();
    int64_t v = 0;
    size_t used = 0;
    try {
      v = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != s.size()) fail(where + key, "'" + s + "' is not an integer");
    if (v < lo || v > hi) fail(where + key, std::to_string(v) + " is outside [" + std::to_string(lo) + ", " +
                                                std::to_string(hi) + "]");
    return v;
  }
};

// ",\n  \"layout\": {...}" (nothing for a manifest without one).
std::string layout_json(const ManifestLayout& l) {
  if (!l.present) return "";
  std::ostringstream os;
  os << ",\n  \"layout\": {\"digest\": \"" << hex16(l.digest) << "\",\n    \"keys\": {";
  for (size_t i = 0; i < l.keys.size(); ++i)
    os << (i ? ", " : "") << json_string(l.keys[i].first) << ": " << json_string(l.keys[i].second);
  os << "},\n    \"groups\": [";
  for (size_t g = 0; g < l.groups.size(); ++g) {
    os << (g ? ",\n      [" : "\n      [");
    for (size_t i = 0; i < l.groups[g].size(); ++i) {
      const LayoutParam& p = l.groups[g][i];
      os << (i ? ", " : "") << "{\"name\": " << json_string(p.name) << ", \"shape\": " << shape_text(p.shape) << "}";
    }
    os << "]";
  }
  os << "]}";
  return os.str();
}

// The manifest's "layout" object: the keys layout_keys() names, groups 0 and 1 described in full.
ManifestLayout parse_layout(const Reader& r, const YAML::Node& node) {
  ManifestLayout l;
  if (!node.IsMap()) r.fail("layout", "not an object");
  l.present = true;
  const std::string digest = r.text(node, "digest", "layout.");
  if (!is_hex16(digest)) r.fail("layout.digest", "'" + digest + "' is not 16 hex digits");
  l.digest = std::stoull(digest, nullptr, 16);
  const YAML::Node keys = node["keys"];
  if (!keys || !keys.IsMap()) r.fail("layout.keys", "missing or not an object");
  const auto& known = layout_keys();
  for (const auto& kv : keys) {
    const std::string k = kv.first.as<std::string>("");
    if (std::find(known.begin(), known.end(), k) == known.end()) r.fail("layout.keys." + k, "not a layout key");
    const std::string v = r.text(keys, k, "layout.keys.");
    if (v.size() > 4096) r.fail("layout.keys." + k, "longer than 4096 characters");
    l.keys.emplace_back(k, v);
  }
  const YAML::Node groups = node["groups"];
  if (!groups || !groups.IsSequence()) r.fail("layout.groups", "missing or not a list");
  if (groups.size() > kLayoutGroupsInFull)
    r.fail("layout.groups", std::to_string(groups.size()) + " groups described, at most " + std::to_string(kLayoutGroupsInFull));
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string wg = "layout.groups[" + std::to_string(g) + "]";
    if (!groups[g].IsSequence()) r.fail(wg, "not a list");
    l.groups.emplace_back();
    for (size_t i = 0; i < groups[g].size(); ++i) {
      const YAML::Node& p = groups[g][i];
      const std::string where = wg + "[" + std::to_string(i) + "].";
      if (!p.IsMap() || p.size() != 2) r.fail(where + "name", "not an object of name and shape");
      LayoutParam lp;
      lp.name = r.text(p, "name", where);
      if (lp.name.empty() || lp.name.size() > 1024) r.fail(where + "name", "empty or longer than 1024 characters");
      const YAML::Node shape = p["shape"];
      if (!shape || !shape.IsSequence() || shape.size() > 8) r.fail(where + "shape", "not a list of at most 8 sizes");
      for (size_t d = 0; d < shape.size(); ++d) {
        YAML::Node dims;
        dims["d"] = shape[d];
        lp.shape.push_back(r.integer(dims, "d", 0, int64_t{1} << 40, where + "shape."));
      }
      l.groups.back().push_back(lp);
    }
  }
  for (const auto& kv : node) {
    const std::string k = kv.first.as<std::string>("");
    if (k != "digest" && k != "keys" && k != "groups") r.fail("layout." + k, "unknown key");
  }
  return l;
}

// Format 4's "groups", "files", "runs" and "init_from": every file named once by a fixed pattern
// (never a path) and used by a run; runs in group order covering every group once.
void parse_files(const Reader& r, const YAML::Node& root, Manifest& m) {
  m.num_groups = r.integer(root, "groups", 1, kMaxGroups);
  const YAML::Node files = root["files"];
  if (!files || !files.IsSequence()) r.fail("files", "missing or not a list");
  if (files.size() > static_cast<size_t>(kMaxGroups)) r.fail("files", "more files than groups can fill");
  std::set<std::string> names;
  for (size_t i = 0; i < files.size(); ++i) {
    const YAML::Node& n = files[i];
    const std::string where = "files[" + std::to_string(i) + "].";
    if (!n.IsMap()) r.fail("files[" + std::to_string(i) + "]", "not an object");
    ManifestFile f;
    f.file = r.text(n, "file", where);
    int64_t number = 0;
    if (!parse_file_name(f.file, &number)) r.fail(where + "file", "'" + f.file + "' is not shard-NNNNN.pt");
    if (!names.insert(f.file).second) r.fail(where + "file", "'" + f.file + "' listed twice");
    f.bytes = r.integer(n, "bytes", 0, int64_t{1} << 50, where);
    if (f.bytes % 12 != 0) r.fail(where + "bytes", std::to_string(f.bytes) + " is not 12 bytes per value");
    const std::string h = r.text(n, "fnv1a64", where);
    if (!is_hex16(h)) r.fail(where + "fnv1a64", "'" + h + "' is not 16 hex digits");
    f.fnv1a64 = std::stoull(h, nullptr, 16);
    for (const auto& key : n) {
      const std::string k = key.first.as<std::string>("");
      if (k != "file" && k != "bytes" && k != "fnv1a64") r.fail(where + k, "unknown key");
    }
    m.files.push_back(f);
  }
  const YAML::Node runs = root["runs"];
  if (!runs || !runs.IsSequence()) r.fail("runs", "missing or not a list");
  std::vector<uint8_t> used(m.files.size(), 0);
  int64_t next = 0;  // the first group the next run must hold
  bool init_from = false;
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::string where = "runs[" + std::to_string(i) + "]";
    const YAML::Node& n = runs[i];
    if (!n.IsSequence() || n.size() != 3) r.fail(where, "not [first, count, file]");
    YAML::Node v;
    v["first"] = n[0];
    v["count"] = n[1];
    v["file"] = n[2];
    ManifestRun run;
    run.first = r.integer(v, "first", 0, kMaxGroups, where + ".");
    if (run.first != next) r.fail(where + ".first", std::to_string(run.first) + " where the runs before end at " +
                                                         std::to_string(next) + " (runs hold the groups in order, each once)");
    run.count = r.integer(v, "count", 1, kMaxGroups, where + ".");
    if (run.first + run.count > m.num_groups)
      r.fail(where + ".count", "groups " + std::to_string(run.first) + ".." + std::to_string(run.first + run.count - 1) +
                                   " beyond groups: " + std::to_string(m.num_groups));
    run.file = r.integer(v, "file", kRunInitFrom, static_cast<int64_t>(m.files.size()) - 1, where + ".");
    if (run.file >= 0) used[static_cast<size_t>(run.file)] = 1;
    init_from |= run.file == kRunInitFrom;
    next = run.first + run.count;
    m.runs.push_back(run);
  }
  if (next != m.num_groups)
    r.fail("runs", "hold groups 0.." + std::to_string(next - 1) + " of groups: " + std::to_string(m.num_groups));
  for (size_t i = 0; i < used.size(); ++i)
    if (!used[i]) r.fail("files[" + std::to_string(i) + "]", "'" + m.files[i].file + "' holds no group of the runs");
  if (const YAML::Node p = root["init_from"]) {
    if (!p.IsMap()) r.fail("init_from", "not an object");
    m.init_from.present = true;
    m.init_from.path = r.text(p, "path", "init_from.");
    if (m.init_from.path.empty() || m.init_from.path.size() > 4096) r.fail("init_from.path", "empty or longer than 4096 characters");
    m.init_from.size = r.integer(p, "size", 0, int64_t{1} << 60, "init_from.");
    m.init_from.mtime_ns = r.integer(p, "mtime_ns", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), "init_from.");
    for (const auto& key : p) {
      const std::string k = key.first.as<std::string>("");
      if (k != "path" && k != "size" && k != "mtime_ns") r.fail("init_from." + k, "unknown key");
    }
  }
  if (init_from != m.init_from.present)
    r.fail("init_from", init_from ? "missing where a run is of model.init_from (-2)" : "present where no run is of model.init_from");
}

}  // namespace

void check_shard_index(const ManifestShard& sh, int64_t values, const std::vector<int64_t>& offsets,
                       const std::vector<int64_t>& steps, int64_t checkpoint_step, const std::string& file) {
  const auto damaged = [&](const std::string& what) {
    throw ConfigError(file + ": " + what + " (the checkpoint is damaged; use --no-resume or another checkpoint.dir)");
  };
  // The manifest bounds these (parse_manifest); checked again so that no sum below overflows.
  if (sh.first < 0 || sh.first > (int64_t{1} << 21) || sh.count < 1 || sh.count > kShardMaxGroups)
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

std::string shard_file_name(int64_t shard) {
  std::ostringstream os;
  os << "shard-" << std::setw(5) << std::setfill('0') << shard << ".pt";
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

const ManifestRun& run_of(const Manifest& m, int64_t group) {
  const auto it = std::upper_bound(m.runs.begin(), m.runs.end(), group,
                                   [](int64_t g, const ManifestRun& r) { return g < r.first; });
  return *(it - 1);
}

bool parse_file_name(const std::string& name, int64_t* n) {
  const size_t digits = name.size() - std::min(name.size(), sizeof("shard-.pt") - 1);
  if (name.rfind("shard-", 0) != 0 || digits < 5 || digits > 9 || name.compare(name.size() - 3, 3, ".pt") != 0)
    return false;
  int64_t v = 0;
  for (size_t i = 6; i < 6 + digits; ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    v = v * 10 + (name[i] - '0');
  }
  if (n) *n = v;
  return name == shard_file_name(v);  // one spelling per number: no leading zeros beyond five digits
}

void check_file_index(const ManifestFile& f, int64_t values, const std::vector<int64_t>& groups,
                      const std::vector<int64_t>& offsets, const std::vector<int64_t>& steps, int64_t num_groups,
                      int64_t checkpoint_step, const std::string& file) {
  const auto damaged = [&](const std::string& what) {
    throw ConfigError(file + ": " + what + " (the checkpoint is damaged; use --no-resume or another checkpoint.dir)");
  };
  const int64_t count = static_cast<int64_t>(groups.size());
  if (count < 1 || count > kShardMaxGroups) damaged("key 'groups': " + std::to_string(count) + " groups");
  for (size_t i = 0; i < groups.size(); ++i)
    if (groups[i] < 0 || groups[i] >= num_groups || (i > 0 && groups[i] <= groups[i - 1]))
      damaged("key 'groups': " + std::to_string(groups[i]) + " out of order or outside 0.." + std::to_string(num_groups - 1));
  if (static_cast<int64_t>(offsets.size()) != count + 1) damaged("key 'offsets' is not int64 [" + std::to_string(count + 1) + "]");
  if (static_cast<int64_t>(steps.size()) != count) damaged("key 'steps' is not int64 [" + std::to_string(count) + "]");
  for (size_t i = 0; i + 1 < offsets.size(); ++i)
    if (offsets[i] > offsets[i + 1]) damaged("key 'offsets' decreases");
  if (offsets.front() != 0 || offsets.back() != values)
    damaged("key 'offsets' does not span 'param' (" + std::to_string(values) + " values)");
  if (values < 0 || values > f.bytes / 12 || values * 12 != f.bytes)
    damaged(std::to_string(values) + " values where manifest.json says " + std::to_string(f.bytes) + " bytes (12 per value)");
  for (size_t i = 0; i < steps.size(); ++i)
    if (steps[i] < 0 || steps[i] > checkpoint_step)
      damaged("key 'steps': group " + std::to_string(groups[i]) + ": step count " + std::to_string(steps[i]) +
              " outside 0.." + std::to_string(checkpoint_step) + " (the checkpoint's step)");
}

bool has_file_runs(const std::string& format) { return format == kManifestFormat || format == kManifestFormatV4; }

std::string manifest_json(const Manifest& m) {
  std::ostringstream os;
  os << "{\n  \"format\": " << json_string(m.format) << ",\n  \"job\": " << json_string(m.job)
     << ",\n  \"job_hash\": " << json_string(m.job_hash) << ",\n  \"step\": " << m.step
     << ",\n  \"world_size\": " << m.world_size;
  if (has_file_runs(m.format)) {
    os << ",\n  \"groups\": " << m.num_groups << ",\n  \"files\": [";
    for (size_t i = 0; i < m.files.size(); ++i) {
      const ManifestFile& f = m.files[i];
      os << (i ? ",\n    " : "\n    ") << "{\"file\": " << json_string(f.file) << ", \"bytes\": " << f.bytes
         << ", \"fnv1a64\": \"" << hex16(f.fnv1a64) << "\"}";
    }
    os << "\n  ],\n  \"runs\": [";
    for (size_t i = 0; i < m.runs.size(); ++i)
      os << (i ? ", " : "") << "[" << m.runs[i].first << ", " << m.runs[i].count << ", " << m.runs[i].file << "]";
    os << "]";
    if (m.init_from.present)
      os << ",\n  \"init_from\": {\"path\": " << json_string(m.init_from.path) << ", \"size\": " << m.init_from.size
         << ", \"mtime_ns\": " << m.init_from.mtime_ns << "}";
    os << layout_json(m.layout) << "\n}\n";
    return os.str();
  }
  if (m.format == kManifestFormatV3) {
    os << ",\n  \"groups\": " << m.num_groups << ",\n  \"shards\": [";
    for (size_t i = 0; i < m.shards.size(); ++i) {
      const ManifestShard& s = m.shards[i];
      os << (i ? ",\n    " : "\n    ") << "{\"file\": " << json_string(s.file) << ", \"first\": " << s.first
         << ", \"count\": " << s.count << ", \"fnv1a64\": \"" << hex16(s.fnv1a64) << "\"}";
    }
    os << "\n  ]" << layout_json(m.layout) << "\n}\n";
    return os.str();
  }
  os << ",\n  \"groups\": [";
  for (size_t i = 0; i < m.groups.size(); ++i) {
    const ManifestGroup& g = m.groups[i];
    os << (i ? ",\n    " : "\n    ") << "{\"group\": " << g.group << ", \"file\": " << json_string(g.file);
    if (g.has_checksum) os << ", \"fnv1a64\": \"" << hex16(g.fnv1a64) << "\"";
    os << "}";
  }
  os << "\n  ]" << layout_json(m.layout) << "\n}\n";
  return os.str();
}

Manifest parse_manifest(const std::string& text, const std::string& path) {
  const Reader r{path};
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    r.fail("manifest", std::string("not valid JSON (") + e.msg + ")");
  }
  if (!root.IsMap()) r.fail("manifest", "not a JSON object");
  Manifest m;
  m.format = r.text(root, "format");
  if (!has_file_runs(m.format) && m.format != kManifestFormatV3 && m.format != kManifestFormatV2 &&
      m.format != kManifestFormatV1)
    r.fail("format", "'" + m.format + "' is not a format this release reads (" + kManifestFormat + ")");
  const bool linked = has_file_runs(m.format);
  const bool sharded = m.format == kManifestFormatV3;
  const bool checksums = m.format != kManifestFormatV1;
  m.job = r.text(root, "job");
  if (!config::is_job_name(m.job)) r.fail("job", "'" + m.job + "' is not a job name");
  m.job_hash = r.text(root, "job_hash");
  if (!is_hex16(m.job_hash)) r.fail("job_hash", "'" + m.job_hash + "' is not 16 hex digits");
  m.step = r.integer(root, "step", 0, int64_t{1} << 62);
  m.world_size = r.integer(root, "world_size", 1, int64_t{1} << 24);
  if (sharded) {
    m.num_groups = r.integer(root, "groups", 1, kMaxGroups);
    const YAML::Node shards = root["shards"];
    if (!shards || !shards.IsSequence()) r.fail("shards", "missing or not a list");
    int64_t next = 0;  // the first group the next shard must hold
    for (size_t i = 0; i < shards.size(); ++i) {
      const YAML::Node& n = shards[i];
      const std::string where = "shards[" + std::to_string(i) + "].";
      if (!n.IsMap()) r.fail("shards[" + std::to_string(i) + "]", "not an object");
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
      const std::string h = r.text(n, "fnv1a64", where);
      if (!is_hex16(h)) r.fail(where + "fnv1a64", "'" + h + "' is not 16 hex digits");
      sh.fnv1a64 = std::stoull(h, nullptr, 16);
      for (const auto& key : n) {
        const std::string k = key.first.as<std::string>("");
        if (k != "file" && k != "first" && k != "count" && k != "fnv1a64") r.fail(where + k, "unknown key");
      }
      next = sh.first + sh.count;
      m.shards.push_back(sh);
    }
    if (next != m.num_groups)
      r.fail("shards", "hold groups 0.." + std::to_string(next - 1) + " of groups: " + std::to_string(m.num_groups));
  }
  if (linked) parse_files(r, root, m);
  const YAML::Node groups = sharded || linked ? YAML::Node() : root["groups"];
  if (!sharded && !linked && (!groups || !groups.IsSequence())) r.fail("groups", "missing or not a list");
  for (size_t i = 0; !sharded && !linked && i < groups.size(); ++i) {
    const YAML::Node& g = groups[i];
    const std::string where = "groups[" + std::to_string(i) + "].";
    if (!g.IsMap()) r.fail("groups[" + std::to_string(i) + "]", "not an object");
    ManifestGroup mg;
    mg.group = static_cast<int>(r.integer(g, "group", 0, int64_t{1} << 21, where));
    if (mg.group != static_cast<int>(i)) r.fail(where + "group", "groups are not listed 0, 1, 2, ... in order");
    mg.file = r.text(g, "file", where);
    if (mg.file != group_file_name(mg.group))  // a name, never a path
      r.fail(where + "file", "'" + mg.file + "' is not " + group_file_name(mg.group));
    if (checksums) {
      const std::string h = r.text(g, "fnv1a64", where);
      if (!is_hex16(h)) r.fail(where + "fnv1a64", "'" + h + "' is not 16 hex digits");
      mg.fnv1a64 = std::stoull(h, nullptr, 16);
      mg.has_checksum = true;
    }
    m.groups.push_back(mg);
  }
  if (!sharded && !linked) m.num_groups = static_cast<int64_t>(m.groups.size());
  if (const YAML::Node layout = root["layout"]) m.layout = parse_layout(r, layout);
  for (const auto& key : root) {
    const std::string k = key.first.as<std::string>("");
    if (k != "format" && k != "job" && k != "job_hash" && k != "step" && k != "world_size" && k != "groups" &&
        k != "layout" && !(sharded && k == "shards") &&
        !(linked && (k == "files" || k == "runs" || k == "init_from")))
      r.fail(k, "unknown key");
  }
  return m;
}

}  // namespace thetad::daemon
