// Checkpoint files: LibTorch pickles (torch.load-able dicts) plus a JSON manifest; atomic by
// directory rename. See checkpoint.hpp for the layout and protocol.
#include "daemon/state/checkpoint.hpp"

#include <torch/serialize.h>

#include <fcntl.h>
#include <sys/file.h>
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
#include "comm/bucket_plan.hpp"
#include "common/text.hpp"
#include "daemon/core/manifest.hpp"

namespace fs = std::filesystem;

namespace thetad::daemon {
namespace {

std::string step_name(int64_t step) {
  std::ostringstream os;
  os << "step-" << std::setw(8) << std::setfill('0') << step;
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

// A checkpoint file's bytes; ConfigError naming it where it cannot be read whole.
std::vector<char> read_bytes(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec))
    throw ConfigError(p.string() + ": " + (fs::exists(p, ec) ? "not a regular file" : "missing") +
                      " (the checkpoint is damaged; use --no-resume or another checkpoint.dir)");
  std::ifstream in(p, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw ConfigError(p.string() + ": cannot be read: " + std::strerror(errno));
  return bytes;
}

std::string checksum_part(int rank) { return "checksums-rank-" + std::to_string(rank) + ".txt"; }

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
      std::ostringstream sums;  // "group fnv1a64" per line: rank 0 puts them in the manifest
      for (int g = w.rank; g < num_groups; g += w.world) {
        GroupState st = group_state(g);
        c10::Dict<std::string, at::Tensor> dict;
        for (size_t i = 0; i < st.names.size(); ++i) {
          dict.insert("param/" + st.names[i], st.params[i].detach().cpu().contiguous());
          dict.insert("exp_avg/" + st.names[i], st.exp_avg[i].detach().cpu().contiguous());
          dict.insert("exp_avg_sq/" + st.names[i], st.exp_avg_sq[i].detach().cpu().contiguous());
        }
        dict.insert("steps", torch::tensor(st.steps, torch::kInt64));
        const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
        write_file_durable(tmp / group_file_name(g), bytes);
        sums << g << " " << comm::fnv1a64(bytes.data(), bytes.size()) << "\n";
      }
      const std::string text = sums.str();
      write_file_durable(tmp / checksum_part(w.rank), std::vector<char>(text.begin(), text.end()));
    } catch (const std::exception& e) {
      ok = false;
      error = e.what();
    }
  }
  // Every rank learns whether all succeeded; each throws the same way if not. A failed write
  // (a full disk) leaves no temporary directory behind to fill the disk further: rank 0 removes
  // it once every rank has stopped writing (the agreement), and the newest complete checkpoint
  // stays what it was.
  const auto agree = [&](const char* elsewhere) {
    if (w.all_ok(ok)) return;
    std::string removed;
    if (w.rank == 0) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      removed = ec ? "; could not remove " + tmp.string() + ": " + ec.message() : "; " + tmp.string() + " removed";
    }
    throw Error("checkpoint at step " + std::to_string(w.step) + " failed" +
                (error.empty() ? std::string(elsewhere) : ": " + error) + removed +
                " (the newest complete checkpoint in " + w.dir + " is unchanged)");
  };
  agree(" on another rank");
  // Rank 0 publishes: the manifest last, the directory renamed into place once everything in it
  // is on disk, then the rename itself synced.
  if (w.rank == 0) try {
    Manifest m;
    m.job = w.job_name;
    m.job_hash = w.job_hash;
    m.step = w.step;
    m.world_size = w.world;
    m.groups.resize(static_cast<size_t>(num_groups));
    for (int g = 0; g < num_groups; ++g) m.groups[static_cast<size_t>(g)] = {g, group_file_name(g), 0, false};
    for (int r = 0; r < w.world; ++r) {  // every rank's checksums, then its part file goes
      const fs::path part = tmp / checksum_part(r);
      std::ifstream in(part);
      int g = 0;
      uint64_t sum = 0;
      while (in >> g >> sum) {
        THETAD_CHECK(g >= 0 && g < num_groups, InternalError, part.string(), ": group ", g);
        m.groups[static_cast<size_t>(g)].fnv1a64 = sum;
        m.groups[static_cast<size_t>(g)].has_checksum = true;
      }
      fs::remove(part);
    }
    for (const auto& g : m.groups)
      THETAD_CHECK(g.has_checksum, InternalError, "checkpoint: no checksum for group ", g.group);
    const std::string s = manifest_json(m);
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

CheckpointDirLock::CheckpointDirLock(const std::string& dir, const std::string& job_name) {
  const auto refuse = [&](const std::string& why) {
    throw ConfigError("checkpoint.dir " + dir + ": " + why + " (found before any step)");
  };
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir, ec)) refuse(fs::exists(dir) ? "exists and is not a directory" : "cannot be created: " + ec.message());
  const fs::path lock = fs::path(dir) / ".lock";
  fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) refuse(std::string("not writable: ") + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder(256, '\0');
    const ssize_t n = ::pread(fd_, holder.data(), holder.size(), 0);
    holder.resize(n > 0 ? static_cast<size_t>(n) : 0);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      refuse("in use by another job (" + (holder.empty() ? std::string("holder unknown") : holder) +
             "); two jobs on one checkpoint directory would publish over each other's steps");
    refuse(std::string("cannot be locked: ") + std::strerror(err));
  }
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &utc);
  const std::string who = "job " + job_name + ", pid " + std::to_string(::getpid()) + " on " + host + " since " + stamp;
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, who.data(), who.size(), 0) != static_cast<ssize_t>(who.size()))
    refuse(std::string("not writable: ") + std::strerror(errno));
  // The checkpoints themselves need files written and synced in it: prove it now, not after training.
  const fs::path probe = fs::path(dir) / ".write-probe";
  try {
    write_file_durable(probe, std::vector<char>(who.begin(), who.end()));
    fs::remove(probe);
  } catch (const std::exception& e) {
    refuse(std::string("not writable: ") + e.what());
  }
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
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

CheckpointReader::CheckpointReader(const CheckpointInfo& ckpt, int num_groups, const std::string& expected_job_hash)
    : ckpt_(ckpt) {
  const fs::path path = fs::path(ckpt.path) / "manifest.json";
  const std::vector<char> text = read_bytes(path);
  manifest_ = parse_manifest(std::string(text.begin(), text.end()), path.string());
  if (manifest_.step != ckpt.step)
    throw ConfigError(path.string() + ": step: " + std::to_string(manifest_.step) + " but the directory is of step " +
                      std::to_string(ckpt.step) + " (the checkpoint is damaged; use --no-resume or another "
                      "checkpoint.dir)");
  if (!expected_job_hash.empty() && manifest_.job_hash != expected_job_hash)
    throw ConfigError(path.string() + ": checkpoint is of another model (job_hash " + manifest_.job_hash +
                      ", this job " + expected_job_hash + "); use --no-resume or another checkpoint.dir");
  if (num_groups >= 0 && static_cast<int>(manifest_.groups.size()) != num_groups)
    throw ConfigError(path.string() + ": groups: " + std::to_string(manifest_.groups.size()) + " groups, this job has " +
                      std::to_string(num_groups) + " (use --no-resume or another checkpoint.dir)");
}

GroupState CheckpointReader::load_group(int group) const {
  THETAD_CHECK(group >= 0 && group < static_cast<int>(manifest_.groups.size()), InternalError, "no group ", group,
               " in ", ckpt_.path);
  const ManifestGroup& mg = manifest_.groups[static_cast<size_t>(group)];
  const fs::path file = fs::path(ckpt_.path) / mg.file;  // a fixed name: parse_manifest allows no path
  const std::vector<char> bytes = read_bytes(file);
  const auto damaged = [&](const std::string& what) {
    return ConfigError(file.string() + ": " + what + " (the checkpoint is damaged; use --no-resume or another "
                       "checkpoint.dir)");
  };
  if (mg.has_checksum) {
    const uint64_t sum = comm::fnv1a64(bytes.data(), bytes.size());
    if (sum != mg.fnv1a64) {
      std::ostringstream os;
      os << "checksum " << std::hex << std::setw(16) << std::setfill('0') << sum << " where manifest.json says "
         << std::setw(16) << mg.fnv1a64 << " (" << std::dec << bytes.size() << " bytes)";
      throw damaged(os.str());
    }
  }
  const c10::impl::GenericDict dict = [&] {
    try {
      c10::IValue v = torch::pickle_load(bytes);
      if (!v.isGenericDict()) throw damaged("not a dict of tensors");
      return v.toGenericDict();
    } catch (const c10::Error& e) {
      throw damaged(std::string("not a dict of tensors: ") + e.what_without_backtrace());
    }
  }();
  const auto tensor = [&](const std::string& key) {
    auto it = dict.find(key);
    if (it == dict.end()) throw damaged("key '" + key + "' missing");
    if (!it->value().isTensor()) throw damaged("key '" + key + "' is not a tensor");
    return it->value().toTensor();
  };
  GroupState st;
  st.group = group;
  for (const auto& item : dict) {
    if (!item.key().isString()) throw damaged("a key that is not a string");
    const std::string key = item.key().toStringRef();
    if (key.rfind("param/", 0) == 0) st.names.push_back(key.substr(6));
  }
  for (const auto& name : st.names) {
    st.params.push_back(tensor("param/" + name));
    // Training on from NaN or Inf would only spread it: refused before any step.
    if (!torch::isfinite(st.params.back()).all().item<bool>())
      throw ConfigError(file.string() + ": parameter '" + name + "' holds NaN or Inf (resume from an earlier "
                        "checkpoint, or start anew with --no-resume)");
    st.exp_avg.push_back(tensor("exp_avg/" + name));
    st.exp_avg_sq.push_back(tensor("exp_avg_sq/" + name));
  }
  const at::Tensor steps = tensor("steps");
  if (steps.numel() != 1 || steps.scalar_type() != at::kLong) throw damaged("key 'steps' is not one int64");
  st.steps = steps.item<int64_t>();
  return st;
}

}  // namespace thetad::daemon
