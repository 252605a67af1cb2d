// The sources of a checkpoint's unstored groups (see init_sources.hpp).
#include "daemon/checkpoint_format/init_sources.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "common/errors.hpp"

namespace thetad::daemon {
namespace {

namespace fs = std::filesystem;

const char* const kAdvice = " (restore it, set the job back, or start anew with --no-resume)";

std::string print_text(const InitFromPrint& p) {
  if (!p.present) return "absent";
  return "size " + std::to_string(p.size) + ", mtime_ns " + std::to_string(p.mtime_ns);
}

// The groups a run list leaves unstored, as "group 0" or "groups 3, 5, ... (n groups)".
std::string unstored_groups(const Manifest& m) {
  std::vector<int64_t> gs;
  for (const ManifestRun& r : m.runs)
    for (int64_t g = r.first; r.file < 0 && g < r.first + r.count && gs.size() < 4; ++g) gs.push_back(g);
  std::string s = gs.size() == 1 ? "group " : "groups ";
  for (size_t i = 0; i < gs.size(); ++i) s += (i ? ", " : "") + std::to_string(gs[i]);
  return s + (gs.size() == 4 ? ", ..." : "");
}

int64_t mtime_of(const struct stat& s) { return int64_t{s.st_mtim.tv_sec} * 1000000000 + s.st_mtim.tv_nsec; }

struct SourceFile {
  std::string name;
  int64_t size = 0;
  int64_t mtime_ns = 0;
};

// A directory's files that fingerprint_path counts, by name.
std::vector<SourceFile> source_files(const std::string& dir, const std::string& what, bool legacy) {
  std::vector<SourceFile> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    struct stat fst {};
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file(ec) || (!legacy && !read_from_source_dir(name)) || ::stat(e.path().c_str(), &fst) != 0)
      continue;
    files.push_back({name, fst.st_size, mtime_of(fst)});
  }
  if (ec) throw Error(what + ": cannot list " + dir + ": " + ec.message());
  std::sort(files.begin(), files.end(), [](const SourceFile& a, const SourceFile& b) { return a.name < b.name; });
  return files;
}

// Whether `path` is as `recorded` says: by the fingerprint of today's files, or of the earlier one.
bool unchanged(const std::string& path, const InitFromPrint& recorded, const std::string& what) {
  if (fingerprint_path(path, what) == recorded) return true;
  return recorded.present && fingerprint_path(path, what, /*legacy=*/true) == recorded;
}

// Which files of a changed directory to name: those written since the record (a newer mtime), or,
// where none is, every file the run reads with its size (one was removed or put back older).
std::string changed_files(const std::string& path, const InitFromPrint& recorded, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return "";
  std::string newer, all;
  for (const SourceFile& f : source_files(path, what, false)) {
    if (f.mtime_ns > recorded.mtime_ns) newer += (newer.empty() ? "" : ", ") + f.name;
    all += (all.empty() ? "" : ", ") + f.name + " (" + std::to_string(f.size) + " bytes)";
  }
  if (!newer.empty()) return "; written since: " + newer;
  return "; the files it reads now: " + (all.empty() ? std::string("none") : all);
}

}  // namespace

bool read_from_source_dir(const std::string& name) {
  const std::string ext = ".safetensors";
  return name == "config.json" || name == "adapter_config.json" || name == "model.safetensors.index.json" ||
         (name.size() > ext.size() && name.compare(name.size() - ext.size(), ext.size(), ext) == 0);
}

InitFromPrint fingerprint_path(const std::string& path, const std::string& what, bool legacy) {
  InitFromPrint f;
  f.path = path;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return f;  // absent
    throw Error(what + ": cannot read " + path + ": " + std::strerror(errno));
  }
  f.present = true;
  f.mtime_ns = legacy || !S_ISDIR(st.st_mode) ? mtime_of(st) : 0;
  if (!S_ISDIR(st.st_mode)) {
    f.size = st.st_size;
    return f;
  }
  for (const SourceFile& file : source_files(path, what, legacy)) {
    f.size += file.size;
    f.mtime_ns = std::max(f.mtime_ns, file.mtime_ns);
  }
  return f;
}

std::vector<int64_t> initial_tasks(const std::vector<ManifestRun>& runs) {
  std::vector<int64_t> tasks;
  for (const ManifestRun& r : runs)
    if (r.file == kRunInitial)
      for (int64_t g = std::max<int64_t>(1, r.first); g < r.first + r.count; ++g) tasks.push_back(g - 1);
  return tasks;
}

std::vector<std::string> check_init_sources(const Manifest& m, const InitSourcesNow& now, const std::string& manifest_path) {
  std::vector<std::string> notes;
  const bool initial = std::any_of(m.runs.begin(), m.runs.end(), [](const ManifestRun& r) { return r.file == kRunInitial; });
  const std::string where = manifest_path + ": " + unstored_groups(m) + " (never trained, not stored in the checkpoint) ";
  const InitSources& s = m.init;
  if (s.has_seed && initial && s.seed != now.seed)
    throw ConfigError(where + "were drawn from seed " + std::to_string(s.seed) + "; this job's " + now.seed_key + " gives " +
                      std::to_string(now.seed) + kAdvice);
  if (s.model.present) {
    if (now.model_path != s.model.path)
      throw ConfigError(where + "take their values from model.init_from " + s.model.path + "; this job's model.init_from is '" +
                        now.model_path + "'" + kAdvice);
    InitFromPrint p;
    bool same = false;
    std::string files;
    try {
      p = fingerprint_path(now.model_path, "model.init_from");
      same = unchanged(now.model_path, s.model, "model.init_from");
      if (!same) files = changed_files(now.model_path, s.model, "model.init_from");
    } catch (const Error& e) {
      throw ConfigError(where + "take their values from it: " + e.what() + kAdvice);
    }
    if (!same)
      throw ConfigError(s.model.path + ": model.init_from: " + (p.present ? "changed" : "gone") + " since the checkpoint " +
                        manifest_path + " relied on it for " + unstored_groups(m) + " (" + print_text(s.model) + " -> " +
                        print_text(p) + files + ")" + kAdvice);
  }
  const std::vector<int64_t> tasks = initial_tasks(m.runs);
  if (tasks.empty()) return notes;
  if (!s.has_seed) {  // formats 4 and 5 recorded neither the seed nor lora.init_from
    if (!now.lora_pattern.empty())
      notes.push_back(manifest_path + ": " + std::to_string(tasks.size()) + " task groups never trained are not stored and "
                      "are read again from lora.init_from " + now.lora_pattern + " or drawn from the seed; this older "
                      "checkpoint format recorded neither, so a change of them since cannot be detected");
    return notes;
  }
  if (s.lora_pattern != now.lora_pattern)
    throw ConfigError(where + "take their values from lora.init_from '" + s.lora_pattern + "' in the checkpoint, '" +
                      now.lora_pattern + "' in this job" + kAdvice);
  for (const TaskPrint& t : s.lora) {
    const std::string dir = now.lora_dir(t.task);
    InitFromPrint p;
    const InitFromPrint recorded{t.print.present, dir, t.print.size, t.print.mtime_ns};
    std::string files;
    try {
      p = fingerprint_path(dir, "lora.init_from");
      if (unchanged(dir, recorded, "lora.init_from")) continue;
      if (p.present && t.print.present) files = changed_files(dir, recorded, "lora.init_from");
    } catch (const Error& e) {
      throw ConfigError(std::string(e.what()) + ": task " + std::to_string(t.task) + "'s adapter, not stored in the checkpoint " +
                        manifest_path + kAdvice);
    }
    const std::string what = !p.present ? "gone" : !t.print.present ? "created" : "changed";
    throw ConfigError(dir + ": lora.init_from: " + what + " since the checkpoint " + manifest_path + " relied on it for task " +
                      std::to_string(t.task) + " (group " + std::to_string(t.task + 1) + ", never trained, not stored; " +
                      (t.print.present ? "its adapter" : "drawn from the seed, no adapter there") + " then: " +
                      print_text(t.print) + ", now: " + print_text(p) + files + ")" + kAdvice);
  }
  return notes;
}

}  // namespace thetad::daemon
