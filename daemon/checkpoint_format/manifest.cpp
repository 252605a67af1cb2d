// The checkpoint manifest (see manifest.hpp): formats 4 to 6, the layout, the manifest's own
// checksum and the names of checkpoint directories and files, read and written with nlohmann's
// JSON (manifest_parse.hpp). Formats 1 to 3: manifest_legacy.cpp.
#include "daemon/checkpoint_format/manifest.hpp"

#include <algorithm>
#include <cctype>
#include <iomanip>
#include <limits>
#include <set>
#include <sstream>

#include "comm/bucket_plan.hpp"
#include "common/errors.hpp"
#include "config/job.hpp"
#include "daemon/checkpoint_format/manifest_parse.hpp"

namespace thetad::daemon {
namespace {

using manifest_detail::hex16;
using manifest_detail::is_hex16;
using manifest_detail::Json;
using manifest_detail::kMaxGroups;
using manifest_detail::OrderedJson;
using manifest_detail::Reader;

// {"path": ..., "size": ..., "mtime_ns": ...} at `where` (size -1: the path did not exist).
InitFromPrint parse_print(const Reader& r, const Json& p, const std::string& where, bool may_be_absent) {
  if (!p.is_object()) r.fail(where, "not an object");
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

OrderedJson print_json(const InitFromPrint& f) {
  return {{"path", f.path}, {"size", f.present ? f.size : -1}, {"mtime_ns", f.present ? f.mtime_ns : 0}};
}

// Format 6's "init": the seed, model.init_from and lora.init_from's directories of the initial
// task groups (every such group listed, no other), checked against the runs.
void parse_init(const Reader& r, const Json& n, const std::vector<int64_t>& initial_tasks, Manifest& m) {
  if (!n.is_object()) r.fail("init", "not an object");
  InitSources& s = m.init;
  s.has_seed = true;
  s.seed = r.unsigned_integer(n, "seed", "init.");
  if (const auto p = n.find("model.init_from"); p != n.end()) s.model = parse_print(r, *p, "init.model.init_from", false);
  if (const auto found = n.find("lora.init_from"); found != n.end()) {
    const Json& l = *found;
    if (!l.is_object()) r.fail("init.lora.init_from", "not an object");
    s.lora_pattern = r.text(l, "pattern", "init.lora.init_from.");
    if (s.lora_pattern.empty() || s.lora_pattern.size() > 4096)
      r.fail("init.lora.init_from.pattern", "empty or longer than 4096 characters");
    const auto tasks_at = l.find("tasks");
    if (tasks_at == l.end() || !tasks_at->is_array()) r.fail("init.lora.init_from.tasks", "missing or not a list");
    const Json& tasks = *tasks_at;
    if (tasks.size() != initial_tasks.size())
      r.fail("init.lora.init_from.tasks", std::to_string(tasks.size()) + " tasks where the runs hold " +
                                              std::to_string(initial_tasks.size()) + " initial task groups");
    for (size_t i = 0; i < tasks.size(); ++i) {
      const std::string where = "init.lora.init_from.tasks[" + std::to_string(i) + "]";
      if (!tasks[i].is_array() || tasks[i].size() != 3) r.fail(where, "not [task, size, mtime_ns]");
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
void parse_files(const Reader& r, const Json& root, Manifest& m) {
  const bool v6 = m.format == kManifestFormat;
  m.num_groups = r.integer(root, "groups", 1, kMaxGroups);
  const auto files_at = root.find("files");
  if (files_at == root.end() || !files_at->is_array()) r.fail("files", "missing or not a list");
  const Json& files = *files_at;
  if (files.size() > static_cast<size_t>(kMaxGroups)) r.fail("files", "more files than groups can fill");
  std::set<std::string> names;
  static const char* const kFileKeys[] = {"file", "bytes", "fnv1a64", nullptr};
  for (size_t i = 0; i < files.size(); ++i) {
    const Json& n = files[i];
    const std::string where = "files[" + std::to_string(i) + "].";
    if (!n.is_object()) r.fail("files[" + std::to_string(i) + "]", "not an object");
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
  const auto runs_at = root.find("runs");
  if (runs_at == root.end() || !runs_at->is_array()) r.fail("runs", "missing or not a list");
  const Json& runs = *runs_at;
  std::vector<uint8_t> used(m.files.size(), 0);
  std::vector<int64_t> initial_tasks;  // the tasks of groups >= 1 in kRunInitial runs, ascending
  int64_t next = 0;  // the first group the next run must hold
  bool init_from = false, initial = false;
  const size_t width = v6 ? 4 : 3;
  for (size_t i = 0; i < runs.size(); ++i) {
    const Json& n = runs[i];
    const std::string where = "runs[" + std::to_string(i) + "]";
    if (!n.is_array() || n.size() != width) r.fail(where, v6 ? "not [first, count, file, steps]" : "not [first, count, file]");
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
    const auto n = root.find("init");
    const bool given = n != root.end();
    if (given != (init_from || initial))
      r.fail("init", given ? "present where no run is of groups not stored" : "missing where a run is of groups not stored");
    if (given) parse_init(r, *n, initial_tasks, m);
    if (init_from && !m.init.model.present) r.fail("init.model.init_from", "missing where a run is of model.init_from (-2)");
    return;
  }
  if (const auto p = root.find("init_from"); p != root.end()) m.init.model = parse_print(r, *p, "init_from", false);
  if (init_from != m.init.model.present)
    r.fail("init_from", init_from ? "missing where a run is of model.init_from (-2)" : "present where no run is of model.init_from");
}

// Formats 4 to 6's "groups", "files", "runs" and their sources ("init_from" or "init").
void add_files(OrderedJson& root, const Manifest& m) {
  const bool v6 = m.format == kManifestFormat;
  root["groups"] = m.num_groups;
  OrderedJson files = OrderedJson::array(), runs = OrderedJson::array();
  for (const ManifestFile& f : m.files) files.push_back({{"file", f.file}, {"bytes", f.bytes}, {"fnv1a64", hex16(f.fnv1a64)}});
  for (const ManifestRun& r : m.runs) {
    OrderedJson run = {r.first, r.count, r.file};
    if (v6) run.push_back(r.steps);
    runs.push_back(std::move(run));
  }
  root["files"] = std::move(files);
  root["runs"] = std::move(runs);
  if (!v6) {
    if (m.init.model.present) root["init_from"] = print_json(m.init.model);
    return;
  }
  if (std::none_of(m.runs.begin(), m.runs.end(), [](const ManifestRun& r) { return r.file < 0; })) return;
  const InitSources& s = m.init;
  OrderedJson init = {{"seed", s.seed}};
  if (s.model.present) init["model.init_from"] = print_json(s.model);
  if (!s.lora_pattern.empty()) {
    OrderedJson tasks = OrderedJson::array();
    for (const TaskPrint& t : s.lora)
      tasks.push_back({t.task, t.print.present ? t.print.size : -1, t.print.present ? t.print.mtime_ns : 0});
    init["lora.init_from"] = {{"pattern", s.lora_pattern}, {"tasks", std::move(tasks)}};
  }
  root["init"] = std::move(init);
}

// Format 6: the text must end with its "checksum" key, `"checksum": "<16 hex>"` and the closing
// brace, and that checksum must be of every byte before the key: checked before anything the
// manifest says is believed.
void check_text_checksum(const Reader& r, const std::string& text) {
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
  OrderedJson root = {{"format", m.format}, {"job", m.job}, {"job_hash", m.job_hash}, {"step", m.step},
                      {"world_size", m.world_size}};
  if (has_file_runs(m.format)) add_files(root, m);
  else manifest_detail::add_legacy(root, m);
  manifest_detail::add_layout(root, m.layout);
  const std::string text = manifest_detail::open_text(root);
  if (m.format != kManifestFormat) return text + "\n}\n";
  // Format 6: its checksum last, of every byte before it.
  const std::string body = text + ",\n  ";
  return body + "\"checksum\": \"" + hex16(manifest_text_checksum(body)) + "\"\n}\n";
}

Manifest parse_manifest(const std::string& text, const std::string& path) {
  const Reader r{path};
  const Json root = r.parse(text);
  Manifest m;
  m.format = r.text(root, "format");
  const bool linked = has_file_runs(m.format);
  if (!linked && m.format != kManifestFormatV3 && m.format != kManifestFormatV2 && m.format != kManifestFormatV1)
    r.fail("format", "'" + m.format + "' is not a format this release reads (" + kManifestFormat + ")");
  // The text's checksum, its last key (the parser keeps a key's last value: that one).
  if (m.format == kManifestFormat) check_text_checksum(r, text);
  m.job = r.text(root, "job");
  if (!config::is_job_name(m.job)) r.fail("job", "'" + m.job + "' is not a job name");
  m.job_hash = r.text(root, "job_hash");
  if (!is_hex16(m.job_hash)) r.fail("job_hash", "'" + m.job_hash + "' is not 16 hex digits");
  m.step = r.integer(root, "step", 0, kMaxStep);
  m.world_size = r.integer(root, "world_size", 1, int64_t{1} << 24);
  if (linked) parse_files(r, root, m);
  else manifest_detail::parse_legacy(r, root, m);
  if (const auto layout = root.find("layout"); layout != root.end()) m.layout = manifest_detail::parse_layout(r, *layout);
  const bool v6 = m.format == kManifestFormat, sharded = m.format == kManifestFormatV3;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& k = it.key();
    if (k != "format" && k != "job" && k != "job_hash" && k != "step" && k != "world_size" && k != "groups" &&
        k != "layout" && !(sharded && k == "shards") && !(linked && (k == "files" || k == "runs")) &&
        !(linked && !v6 && k == "init_from") && !(v6 && (k == "init" || k == "checksum")))
      r.fail(k, "unknown key");
  }
  return m;
}

}  // namespace thetad::daemon
