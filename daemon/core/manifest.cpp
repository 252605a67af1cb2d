// The checkpoint manifest (see manifest.hpp). JSON is YAML's flow style, so yaml-cpp reads it.
#include "daemon/core/manifest.hpp"

#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <iomanip>
#include <sstream>

#include "common/errors.hpp"
#include "common/text.hpp"
#include "config/job.hpp"

namespace thetad::daemon {
namespace {

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

}  // namespace

std::string group_file_name(int group) {
  std::ostringstream os;
  os << "group-" << std::setw(4) << std::setfill('0') << group << ".pt";
  return os.str();
}

std::string manifest_json(const Manifest& m) {
  std::ostringstream os;
  os << "{\n  \"format\": " << json_string(m.format) << ",\n  \"job\": " << json_string(m.job)
     << ",\n  \"job_hash\": " << json_string(m.job_hash) << ",\n  \"step\": " << m.step
     << ",\n  \"world_size\": " << m.world_size << ",\n  \"groups\": [";
  for (size_t i = 0; i < m.groups.size(); ++i) {
    const ManifestGroup& g = m.groups[i];
    os << (i ? ",\n    " : "\n    ") << "{\"group\": " << g.group << ", \"file\": " << json_string(g.file);
    if (g.has_checksum) os << ", \"fnv1a64\": \"" << hex16(g.fnv1a64) << "\"";
    os << "}";
  }
  os << "\n  ]\n}\n";
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
  if (m.format != kManifestFormat && m.format != kManifestFormatV1)
    r.fail("format", "'" + m.format + "' is not a format this release reads (" + kManifestFormat + ")");
  const bool checksums = m.format == kManifestFormat;
  m.job = r.text(root, "job");
  if (!config::is_job_name(m.job)) r.fail("job", "'" + m.job + "' is not a job name");
  m.job_hash = r.text(root, "job_hash");
  if (!is_hex16(m.job_hash)) r.fail("job_hash", "'" + m.job_hash + "' is not 16 hex digits");
  m.step = r.integer(root, "step", 0, int64_t{1} << 62);
  m.world_size = r.integer(root, "world_size", 1, int64_t{1} << 24);
  const YAML::Node groups = root["groups"];
  if (!groups || !groups.IsSequence()) r.fail("groups", "missing or not a list");
  for (size_t i = 0; i < groups.size(); ++i) {
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
  for (const auto& key : root) {
    const std::string k = key.first.as<std::string>("");
    if (k != "format" && k != "job" && k != "job_hash" && k != "step" && k != "world_size" && k != "groups")
      r.fail(k, "unknown key");
  }
  return m;
}

}  // namespace thetad::daemon
