// Checkpoint files: LibTorch pickles (torch.load-able dicts) plus a JSON manifest; atomic by
// directory rename. See checkpoint.hpp for the layout and protocol.
#include "daemon/state/checkpoint.hpp"

#include <torch/serialize.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <regex>
#include <sstream>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/text.hpp"

namespace fs = std::filesystem;

namespace thetad::daemon {
namespace {

std::string step_name(int64_t step) {
  std::ostringstream os;
  os << "step-" << std::setw(8) << std::setfill('0') << step;
  return os.str();
}

std::string group_file(int group) {
  std::ostringstream os;
  os << "group-" << std::setw(4) << std::setfill('0') << group << ".pt";
  return os.str();
}

[[noreturn]] void io_error(const std::string& what, const fs::path& p) {
  throw Error("checkpoint: " + what + " " + p.string() + ": " + std::strerror(errno));
}

// Writes the file under path.part, on disk (fsync) before it takes its name: a crash leaves the
// old contents or the new ones, never a torn file.
void write_file_durable(const fs::path& path, const std::vector<char>& bytes) {
  fs::path part = path;
  part += ".part";
  const int fd = ::open(part.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_error("cannot write", part);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      io_error("short write to", part);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    io_error("cannot sync", part);
  }
  if (::close(fd) != 0) io_error("cannot close", part);
  fs::rename(part, path);
}

// A directory's entries (creations, renames) on disk.
void sync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_error("cannot open directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0 && errno != EINVAL) io_error("cannot sync directory", dir);  // EINVAL: fs without it
}

// Completed steps of a checkpoint directory's name, or -1.
int64_t step_of(const fs::path& p) {
  static const std::regex re("step-([0-9]{8})");
  std::smatch m;
  const std::string name = p.filename().string();
  return std::regex_match(name, m, re) ? std::stoll(m[1].str()) : -1;
}

// After publishing `step`: keeps the newest `keep` checkpoints up to it (it included) and drops
// the temporary directories of interrupted writes. Newer checkpoints, if any, are left alone.
void prune(const fs::path& root, int64_t step, int64_t keep) {
  std::vector<std::pair<int64_t, fs::path>> older;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp-step-", 0) == 0) {
      fs::remove_all(e.path());
      continue;
    }
    const int64_t s = step_of(e.path());
    if (s >= 0 && s < step) older.emplace_back(s, e.path());
  }
  std::sort(older.begin(), older.end());
  const size_t keep_older = keep > 1 ? static_cast<size_t>(keep - 1) : 0;
  for (size_t i = 0; i + keep_older < older.size(); ++i) fs::remove_all(older[i].second);
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::optional<CheckpointInfo> find_latest_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return std::nullopt;
  std::optional<CheckpointInfo> best;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const int64_t step = step_of(entry.path());
    if (step < 0) continue;
    if (!fs::exists(entry.path() / "manifest.json")) continue;  // incomplete
    if (!best || step > best->step) best = CheckpointInfo{entry.path().string(), step};
  }
  return best;
}

std::string checkpoint_path(const std::string& dir, int64_t step) { return (fs::path(dir) / step_name(step)).string(); }

std::string write_checkpoint(const CheckpointWriter& w, int num_groups,
                             const std::function<GroupState(int)>& group_state) {
  const fs::path root(w.dir);
  const fs::path tmp = root / (".tmp-" + step_name(w.step));
  const fs::path final_dir = root / step_name(w.step);
  bool ok = true;
  std::string error;
  if (w.rank == 0) {
    try {
      fs::create_directories(root);
      fs::remove_all(tmp);  // left over from a run killed mid-write
      fs::create_directories(tmp);
    } catch (const std::exception& e) {
      ok = false;
      error = e.what();
    }
  }
  w.barrier();
  if (ok) {
    try {
      for (int g = w.rank; g < num_groups; g += w.world) {
        GroupState st = group_state(g);
        c10::Dict<std::string, at::Tensor> dict;
        for (size_t i = 0; i < st.names.size(); ++i) {
          dict.insert("param/" + st.names[i], st.params[i].detach().cpu().contiguous());
          dict.insert("exp_avg/" + st.names[i], st.exp_avg[i].detach().cpu().contiguous());
          dict.insert("exp_avg_sq/" + st.names[i], st.exp_avg_sq[i].detach().cpu().contiguous());
        }
        dict.insert("steps", torch::tensor(st.steps, torch::kInt64));
        write_file_durable(tmp / group_file(g), torch::pickle_save(c10::IValue(dict)));
      }
    } catch (const std::exception& e) {
      ok = false;
      error = e.what();
    }
  }
  // Every rank learns whether all succeeded; each throws the same way if not.
  const auto agree = [&](const char* elsewhere) {
    if (!w.all_ok(ok))
      throw Error("checkpoint at step " + std::to_string(w.step) + " failed" +
                  (error.empty() ? std::string(elsewhere) : ": " + error));
  };
  agree(" on another rank");
  // Rank 0 publishes: the manifest last, the directory renamed into place once everything in it
  // is on disk, then the rename itself synced.
  if (w.rank == 0) try {
    std::ostringstream m;
    m << "{\n  \"format\": \"thetad-checkpoint-1\",\n  \"job\": " << json_string(w.job_name)
      << ",\n  \"job_hash\": \"" << w.job_hash << "\",\n  \"step\": " << w.step
      << ",\n  \"world_size\": " << w.world << ",\n  \"groups\": [";
    for (int g = 0; g < num_groups; ++g)
      m << (g ? ", " : "") << "{\"group\": " << g << ", \"file\": \"" << group_file(g) << "\"}";
    m << "]\n}\n";
    std::string s = m.str();
    write_file_durable(tmp / "manifest.json", std::vector<char>(s.begin(), s.end()));
    sync_dir(tmp);
    fs::remove_all(final_dir);  // the same step written before (a rerun): replaced whole
    fs::rename(tmp, final_dir);
    sync_dir(root);
    prune(root, w.step, w.keep);
    THETAD_LOG(info, "ckpt") << "checkpoint written: " << final_dir.string();
  } catch (const std::exception& e) {
    ok = false;
    error = e.what();
  }
  agree(" on rank 0");
  return final_dir.string();
}

std::string set_aside_checkpoints(const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return "";
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (step_of(e.path()) >= 0) found.push_back(e.path());
  if (found.empty()) return "";
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  fs::path aside = fs::path(dir) / (std::string("previous-") + stamp);
  for (int i = 1; fs::exists(aside); ++i) aside = fs::path(dir) / (std::string("previous-") + stamp + "-" + std::to_string(i));
  fs::create_directories(aside);
  for (const auto& p : found) fs::rename(p, aside / p.filename());
  sync_dir(aside);
  sync_dir(dir);
  return aside.string();
}

GroupState load_group(const CheckpointInfo& ckpt, int group, const std::string& expected_job_hash) {
  const fs::path dir(ckpt.path);
  const std::string manifest = read_text(dir / "manifest.json");
  static const std::regex hash_re("\"job_hash\": \"([0-9a-f]+)\"");
  std::smatch m;
  if (!std::regex_search(manifest, m, hash_re))
    throw ConfigError(ckpt.path + "/manifest.json: no job_hash");
  if (!expected_job_hash.empty() && m[1].str() != expected_job_hash)
    throw ConfigError(ckpt.path + "/manifest.json: checkpoint is of another model (job_hash " +
                      m[1].str() + ", this job " + expected_job_hash +
                      "); use --no-resume or another checkpoint.dir");
  const fs::path file = dir / group_file(group);
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ConfigError(file.string() + ": missing from checkpoint");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto dict = torch::pickle_load(bytes).toGenericDict();
  GroupState st;
  st.group = group;
  for (const auto& item : dict) {
    const std::string key = item.key().toStringRef();
    if (key.rfind("param/", 0) == 0) st.names.push_back(key.substr(6));
  }
  for (const auto& name : st.names) {
    st.params.push_back(dict.at("param/" + name).toTensor());
    st.exp_avg.push_back(dict.at("exp_avg/" + name).toTensor());
    st.exp_avg_sq.push_back(dict.at("exp_avg_sq/" + name).toTensor());
  }
  st.steps = dict.at("steps").toTensor().item<int64_t>();
  return st;
}

}  // namespace thetad::daemon
