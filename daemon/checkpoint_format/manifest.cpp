// The checkpoint manifest (see manifest.hpp): formats 4 to 6, the layout, the manifest's own
// checksum and the names of checkpoint directories and files. JSON is YAML's flow style, so
// yaml-cpp reads it. Formats 1 to 3: manifest_legacy.cpp.
#include "daemon/checkpoint_format/manifest.hpp"

#include <algorithm>
#include <cctype>
#include <iomanip>
#include <limits>
#include <set>
#include <sstream>

#include "comm/bucket_plan.hpp"
#include "common/errors.hpp"
#include "common/text.hpp"
#include "config/job.hpp"
#include "daemon/checkpoint_format/manifest_parse.hpp"

namespace thetad::daemon {


namespace {

using manifest_detail::hex16;
using manifest_detail::is_hex16;
using manifest_detail::kMaxGroups;
using manifest_detail::layout_json;
using manifest_detail::parse_layout;
using manifest_detail::Reader;

// {"path": ..., "size": ..., "mtime_ns": ...} at `where` (size -1: the path did not exist).
InitFromPrint parse_print(const Reader& r, const YAML::Node& p, const std::string& where, bool may_be_absent) {
  if (!p.IsMap()) r.fail(where, "not an object");
  InitFromPrint f;
  f.path = r.text(p, "path", where + ".");
  if (f.path.empty() || f.path.size() > 4096) r.fail(where + ".path", "empty or longer than 4096 characters");
  f.size = r.integer(p, "size", may_be_absent ? -1 : 0, int64_t{1} << 60, where + ".");
  f.mtime_ns = r.integer(p, "mtime_ns", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), where + ".");
  f.present = f.size >= 0;
  static const char* const kKeys[] = {"path", "size", "mtime_ns", nullptr};
  r.only(p, kKeys, where + ".");
  return f;
}

std::string print_json(const InitFromPrint& f) {
  std::ostringstream os;
  os << "{\"path\": " << json_string(f.path) << ", \"size\": " << (f.present ? f.size : -1)
     << ", \"mtime_ns\": " << (f.present ? f.mtime_ns : 0) << "}";
  return os.str();
}

// Format 6's "init": the seed, model.init_from and lora.init_from's directories of the initial
// task groups (every such group listed, no other), checked against the runs.
void parse_init(const Reader& r, const YAML::Node& n, const std::vector<int64_t>& initial_tasks, Manifest& m) {
  if (!n.IsMap()) r.fail("init", "not an object");
  InitSources& s = m.init;
  s.has_seed = true;
  s.seed = r.unsigned_integer(n, "seed", "init.");
  if (const YAML::Node p = n["model.init_from"]) s.model = parse_print(r, p, "init.model.init_from", false);
  if (const YAML::Node l = n["lora.init_from"]) {
    if (!l.IsMap()) r.fail("init.lora.init_from", "not an object");
    s.lora_pattern = r.text(l, "pattern", "init.lora.init_from.");
    if (s.lora_pattern.empty() || s.lora_pattern.size() > 4096)
      r.fail("init.lora.init_from.pattern", "empty or longer than 4096 characters");
    const YAML::Node tasks = l["tasks"];
    if (!tasks || !tasks.IsSequence()) r.fail("init.lora.init_from.tasks", "missing or not a list");
    if (tasks.size() != initial_tasks.size())
      r.fail("init.lora.init_from.tasks", std::to_string(tasks.size()) + " tasks where the runs hold " +
                                              std::to_string(initial_tasks.size()) + " initial task groups");
    for (size_t i = 0; i < tasks.size(); ++i) {
      const std::string where = "init.lora.init_from.tasks[" + std::to_string(i) + "]";
      if (!tasks[i].IsSequence() || tasks[i].size() != 3) r.fail(where, "not [task, size, mtime_ns]");
      TaskPrint t;
      t.task = r.element(tasks[i], 0, 0, kMaxGroups, where);
      if (t.task != initial_tasks[i])
        r.fail(where, "task " + std::to_string(t.task) + " where the runs' next initial task group is task " +
                          std::to_string(initial_tasks[i]));
      t.print.size = r.element(tasks[i], 1, -1, int64_t{1} << 60, where);
      t.print.mtime_ns = r.element(tasks[i], 2, std::numeric_limits<int64_t>::min(),
                                   std::numeric_limits<int64_t>::max(), where);
      t.print.present = t.print.size >= 0;
      if (!t.print.present) t.print.size = t.print.mtime_ns = 0;
      s.lora.push_back(t);
    }
    static const char* const kLoraKeys[] = {"pattern", "tasks", nullptr};
    r.only(l, kLoraKeys, "init.lora.init_from.");
  }
  static const char* const kKeys[] = {"seed", "model.init_from", "lora.init_from", nullptr};
  r.only(n, kKeys, "init.");
}

// Formats 4 to 6's "groups", "files", "runs" and "init_from" (4, 5) or "init" (6): every file
// named once by a fixed pattern (never a path) and used by a run; runs in group order covering
// every group once (6: each with its step count, within the checkpoint's step).
void parse_files(const Reader& r, const YAML::Node& root, Manifest& m) {
  const bool v6 = m.format == kManifestFormat;
  m.num_groups = r.integer(root, "groups", 1, kMaxGroups);
  const YAML::Node files = root["files"];
  if (!files || !files.IsSequence()) r.fail("files", "missing or not a list");
  if (files.size() > static_cast<size_t>(kMaxGroups)) r.fail("files", "more files than groups can fill");
  std::set<std::string> names;
  static const char* const kFileKeys[] = {"file", "bytes", "fnv1a64", nullptr};
  for (size_t i = 0; i < files.size(); ++i) {
    const YAML::Node& n = files[i];
    const std::string where = "files[" + std::to_string(i) + "].";
    if (!n.IsMap()) r.fail("files[" + std::to_string(i) + "]", "not an object");
    ManifestFile f;
    f.file = r.text(n, "file", where);
    if (!parse_file_name(f.file, nullptr)) r.fail(where + "file", "'" + f.file + "' is not shard-NNNNN.pt");
    if (!names.insert(f.file).second) r.fail(where + "file", "'" + f.file + "' listed twice");
    f.bytes = r.integer(n, "bytes", 0, int64_t{1} << 50, where);
    if (f.bytes % 12 != 0) r.fail(where + "bytes", std::to_string(f.bytes) + " is not 12 bytes per value");
    f.fnv1a64 = r.hex(n, "fnv1a64", where);
    r.only(n, kFileKeys, where);
    m.files.push_back(f);
  }
  const YAML::Node runs = root["runs"];
  if (!runs || !runs.IsSequence()) r.fail("runs", "missing or not a list");
  std::vector<uint8_t> used(m.files.size(), 0);
  std::vector<int64_t> initial_tasks;  // the tasks of groups >= 1 in kRunInitial runs, ascending
  int64_t next = 0;  // the first group the next run must hold
  bool init_from = false, initial = false;
  const size_t width = v6 ? 4 : 3;
  for (size_t i = 0; i < runs.size(); ++i) {
    const YAML::Node& n = runs[i];
    const std::string where = "runs[" + std::to_string(i) + "]";
    if (!n.IsSequence() || n.size() != width) r.fail(where, v6 ? "not [first, count, file, steps]" : "not [first, count, file]");
    ManifestRun run;
    run.first = r.element(n, 0, 0, kMaxGroups, where);
    if (run.first != next) r.fail(where, "first group " + std::to_string(run.first) + " where the runs before end at " +
                                             std::to_string(next) + " (runs hold the groups in order, each once)");
    run.count = r.element(n, 1, 1, kMaxGroups, where);
    if (run.first + run.count > m.num_groups)
      r.fail(where, "groups " + std::to_string(run.first) + ".." + std::to_string(run.first + run.count - 1) +
                        " beyond groups: " + std::to_string(m.num_groups));
    run.file = r.element(n, 2, kRunInitFrom, static_cast<int64_t>(m.files.size()) - 1, where);
    if (v6) {
      run.steps = r.element(n, 3, 0, m.step, where);
      if (run.file < 0 && run.steps != 0)
        r.fail(where, std::to_string(run.steps) + " steps for groups stored nowhere (only groups never trained are)");
    }
    if (run.file >= 0) used[static_cast<size_t>(run.file)] = 1;
    init_from |= run.file == kRunInitFrom;
    initial |= run.file == kRunInitial;
    if (run.file == kRunInitial)
      for (int64_t g = std::max<int64_t>(1, run.first); g < run.first + run.count; ++g) initial_tasks.push_back(g - 1);
    next = run.first + run.count;
    m.runs.push_back(run);
  }
  if (next != m.num_groups)
    r.fail("runs", "hold groups 0.." + std::to_string(next - 1) + " of groups: " + std::to_string(m.num_groups));
  for (size_t i = 0; i < used.size(); ++i)
    if (!used[i]) r.fail("files[" + std::to_string(i) + "]", "'" + m.files[i].file + "' holds no group of the runs");
  if (v6) {
    const YAML::Node n = root["init"];
    if (!n != !(init_from || initial))
      r.fail("init", n ? "present where no run is of groups not stored" : "missing where a run is of groups not stored");
    if (n) parse_init(r, n, initial_tasks, m);
    if (init_from && !m.init.model.present) r.fail("init.model.init_from", "missing where a run is of model.init_from (-2)");
    return;
  }
  if (const YAML::Node p = root["init_from"]) m.init.model = parse_print(r, p, "init_from", false);
  if (init_from != m.init.model.present)
    r.fail("init_from", init_from ? "missing where a run is of model.init_from (-2)" : "present where no run is of model.init_from");
}

void files_json(std::ostream& os, const Manifest& m) {
  const bool v6 = m.format == kManifestFormat;
  os << ",\n  \"groups\": " << m.num_groups << ",\n  \"files\": [";
  for (size_t i = 0; i < m.files.size(); ++i) {
    const ManifestFile& f = m.files[i];
    os << (i ? ",\n    " : "\n    ") << "{\"file\": " << json_string(f.file) << ", \"bytes\": " << f.bytes
       << ", \"fnv1a64\": \"" << hex16(f.fnv1a64) << "\"}";
  }
  os << "\n  ],\n  \"runs\": [";
  for (size_t i = 0; i < m.runs.size(); ++i) {
    const ManifestRun& r = m.runs[i];
    os << (i ? ", " : "") << "[" << r.first << ", " << r.count << ", " << r.file;
    if (v6) os << ", " << r.steps;
    os << "]";
  }
  os << "]";
  const bool unstored = std::any_of(m.runs.begin(), m.runs.end(), [](const ManifestRun& r) { return r.file < 0; });
  if (!v6) {
    if (m.init.model.present) os << ",\n  \"init_from\": " << print_json(m.init.model);
    return;
  }
  if (!unstored) return;
  const InitSources& s = m.init;
  os << ",\n  \"init\": {\"seed\": " << s.seed;
  if (s.model.present) os << ",\n    \"model.init_from\": " << print_json(s.model);
  if (!s.lora_pattern.empty()) {
    os << ",\n    \"lora.init_from\": {\"pattern\": " << json_string(s.lora_pattern) << ", \"tasks\": [";
    for (size_t i = 0; i < s.lora.size(); ++i) {
      const InitFromPrint& p = s.lora[i].print;
      os << (i ? ", " : "") << "[" << s.lora[i].task << ", " << (p.present ? p.size : -1) << ", "
         << (p.present ? p.mtime_ns : 0) << "]";
    }
    os << "]}";
  }
  os << "}";
}

// Format 6: the text must end with its "checksum" key, `"checksum": "<16 hex>"` and the closing
// brace, and that checksum must be of every byte before the key: checked before anything the
// manifest says is believed.
uint64_t check_text_checksum(const Reader& r, const std::string& text) {
  const std::string key = "\"checksum\"";
  const size_t at = text.rfind(key);
  if (at == std::string::npos) r.fail("checksum", "missing (format 6 manifests end with their checksum)");
  size_t i = at + key.size();
  const auto skip_space = [&] {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  };
  const auto expect = [&](char c) {
    skip_space();
    if (i >= text.size() || text[i] != c) r.fail("checksum", "not the manifest's last key, \"checksum\": \"<16 hex digits>\"");
    ++i;
  };
  expect(':');
  expect('"');
  const std::string value = text.substr(i, 16);
  i += 16;
  if (!is_hex16(value)) r.fail("checksum", "'" + value + "' is not 16 hex digits");
  expect('"');
  expect('}');
  skip_space();
  if (i != text.size()) r.fail("checksum", "not the manifest's last key, \"checksum\": \"<16 hex digits>\"");
  const uint64_t computed = manifest_text_checksum(text.substr(0, at));
  if (hex16(computed) != value)
    r.fail("checksum", "the manifest's text hashes to " + hex16(computed) + " where its checksum says " + value +
                           ": manifest.json was changed or damaged after it was written");
  return computed;
}

}  // namespace

std::string step_dir_name(int64_t step) {
  std::ostringstream os;
  os << "step-" << std::setw(8) << std::setfill('0') << step;
  return os.str();
}

int64_t step_of_dir_name(const std::string& name) {
  const std::string prefix = "step-";
  if (name.rfind(prefix, 0) != 0 || name.size() < prefix.size() + 8 || name.size() > prefix.size() + 19) return -1;
  int64_t v = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');  // at most 19 digits: no overflow below 10^19 > 2^63
    if (v > kMaxStep) return -1;
  }
  return name == step_dir_name(v) ? v : -1;  // one spelling per step: no extra leading zeros
}

std::string shard_file_name(int64_t shard) {
  std::ostringstream os;
  os << "shard-" << std::setw(5) << std::setfill('0') << shard << ".pt";
  return os.str();
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

bool has_file_runs(const std::string& format) {
  return format == kManifestFormat || format == kManifestFormatV5 || format == kManifestFormatV4;
}

bool has_block_checksums(const std::string& format) { return format == kManifestFormat || format == kManifestFormatV5; }

uint64_t manifest_text_checksum(const std::string& before_checksum_key) { return comm::fnv1a64(before_checksum_key); }

std::string manifest_json(const Manifest& m) {
  std::ostringstream os;
  os << "{\n  \"format\": " << json_string(m.format) << ",\n  \"job\": " << json_string(m.job)
     << ",\n  \"job_hash\": " << json_string(m.job_hash) << ",\n  \"step\": " << m.step
     << ",\n  \"world_size\": " << m.world_size;
  if (has_file_runs(m.format)) files_json(os, m);
  else manifest_detail::legacy_json(os, m);
  os << layout_json(m.layout);
  if (m.format != kManifestFormat) {
    os << "\n}\n";
    return os.str();
  }
  os << ",\n  ";
  const std::string body = os.str();
  return body + "\"checksum\": \"" + hex16(manifest_text_checksum(body)) + "\"\n}\n";
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
  const bool linked = has_file_runs(m.format);
  if (!linked && m.format != kManifestFormatV3 && m.format != kManifestFormatV2 && m.format != kManifestFormatV1)
    r.fail("format", "'" + m.format + "' is not a format this release reads (" + kManifestFormat + ")");
  // The text's checksum, and the parsed key the same (a duplicate key the parser kept instead).
  if (m.format == kManifestFormat) {
    const uint64_t sum = check_text_checksum(r, text);
    if (r.hex(root, "checksum") != sum) r.fail("checksum", "given twice");
  }
  m.job = r.text(root, "job");
  if (!config::is_job_name(m.job)) r.fail("job", "'" + m.job + "' is not a job name");
  m.job_hash = r.text(root, "job_hash");
  if (!is_hex16(m.job_hash)) r.fail("job_hash", "'" + m.job_hash + "' is not 16 hex digits");
  m.step = r.integer(root, "step", 0, kMaxStep);
  m.world_size = r.integer(root, "world_size", 1, int64_t{1} << 24);
  if (linked) parse_files(r, root, m);
  else manifest_detail::parse_legacy(r, root, m);
  if (const YAML::Node layout = root["layout"]) m.layout = parse_layout(r, layout);
  const bool v6 = m.format == kManifestFormat, sharded = m.format == kManifestFormatV3;
  for (const auto& key : root) {
    const std::string k = key.first.as<std::string>("");
    if (k != "format" && k != "job" && k != "job_hash" && k != "step" && k != "world_size" && k != "groups" &&
        k != "layout" && !(sharded && k == "shards") && !(linked && (k == "files" || k == "runs")) &&
        !(linked && !v6 && k == "init_from") && !(v6 && (k == "init" || k == "checksum")))
      r.fail(k, "unknown key");
  }
  return m;
}

}  // namespace thetad::daemon
