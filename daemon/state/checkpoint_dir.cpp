// Checkpoint directories: durable file writes, names, pruning, finding the newest complete
// checkpoint, the directory lock and setting a previous run's checkpoints aside (checkpoint.hpp,
// checkpoint_files.hpp).
#include <fcntl.h>
#include <ftw.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/safe_file.hpp"
#include "daemon/checkpoint_format/file_checksum.hpp"
#include "daemon/state/checkpoint.hpp"
#include "daemon/state/checkpoint_files.hpp"

namespace thetad::daemon {
namespace ckpt_files {

std::string step_name(int64_t step) { return step_dir_name(step); }

[[noreturn]] void io_error(const std::string& what, const fs::path& p) {
  throw Error("checkpoint: " + what + " " + p.string() + ": " + std::strerror(errno));
}

DurableFile::DurableFile(const fs::path& path) : path_(path), part_(fs::path(path) += ".part") {
  fd_ = safe_file::create_fresh(part_.string());  // a leftover or planted name replaced, never followed
  if (fd_ < 0) io_error("cannot write", part_);
}

DurableFile::~DurableFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(part_.c_str());
}

void DurableFile::keep_errno(int e) {
  int none = 0;
  errno_.compare_exchange_strong(none, e);  // the first failure is the one to report
}

bool DurableFile::write(const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::write(fd_, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      keep_errno(k < 0 ? errno : ENOSPC);
      return false;
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool DurableFile::write_at(const char* p, size_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t k = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      keep_errno(k < 0 ? errno : ENOSPC);
      return false;
    }
    p += k;
    n -= static_cast<size_t>(k);
    offset += static_cast<uint64_t>(k);
  }
  return true;
}

void DurableFile::start_writeback(uint64_t offset, uint64_t n) {
#ifdef __linux__
  // Only a hint: commit's fsync is what makes the bytes durable, so a failure here is ignored.
  (void)::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(n), SYNC_FILE_RANGE_WRITE);
#else
  (void)offset;
  (void)n;
#endif
}

void DurableFile::fail(const std::string& what) {
  if (errno_.load() == 0) throw Error("checkpoint: cannot write " + part_.string() + ": " + what);
  errno = errno_.load();
  io_error("short write to", part_);
}

void DurableFile::commit() {
  if (::fsync(fd_) != 0) io_error("cannot sync", part_);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    ::unlink(part_.c_str());
    io_error("cannot close", part_);
  }
  fs::rename(part_, path_);
}

void write_file_durable(const fs::path& path, const std::vector<char>& bytes) {
  DurableFile f(path);
  if (!f.write(bytes.data(), bytes.size())) f.fail("");
  f.commit();
}

bool file_matches(const fs::path& from, uint64_t checksum, int threads) {
  const int fd = ::open(from.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  uint64_t sum = 0;
  const bool read = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                    file_checksum_of_fd(fd, static_cast<uint64_t>(st.st_size), threads, &sum);
  ::close(fd);
  return read && sum == checksum;
}

std::vector<std::string> checkpoints_holding(const fs::path& p, const fs::path& root) {
  std::vector<std::string> holders;
  struct stat want {};
  if (::stat(p.c_str(), &want) != 0) return holders;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    struct stat st {};
    if (step_of(e.path()) >= 0 && ::stat((e.path() / p.filename()).c_str(), &st) == 0 && st.st_dev == want.st_dev &&
        st.st_ino == want.st_ino)
      holders.push_back(e.path().filename().string());
  }
  std::sort(holders.begin(), holders.end(), [](const std::string& a, const std::string& b) {
    return step_of(a) < step_of(b);
  });
  return holders;
}

bool link_or_copy(const fs::path& from, const fs::path& to) {
  if (::link(from.c_str(), to.c_str()) == 0) return true;
  const int err = errno;
  if (err != EXDEV && err != EPERM && err != EMLINK && err != ENOTSUP && err != EOPNOTSUPP && err != ENOSYS) {
    errno = err;
    io_error("cannot link the unchanged groups' file", from);
  }
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    THETAD_LOG(warn, "ckpt") << "cannot hard-link " << from.string() << " into the new checkpoint (" << std::strerror(err)
                             << "): files of unchanged groups are copied instead (checkpoints then cost their full size)";
  }
  write_file_durable(to, read_bytes(from));
  return false;
}

void sync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_error("cannot open directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0 && errno != EINVAL) io_error("cannot sync directory", dir);  // EINVAL: fs without it
}

int64_t step_of(const fs::path& p) { return step_of_dir_name(p.filename().string()); }

// POSIX's walk, deepest entries first, links not followed. std::filesystem::remove_all of a
// checkpoint directory crashed the rank (SIGSEGV at a jump to an invalid address, the first
// prune of a run) on the GPU image (Ubuntu 24.04, g++ 13, LibTorch 2.11), never on Debian.
void remove_tree(const fs::path& p) {
  const auto remove_one = [](const char* path, const struct stat*, int, struct FTW*) {
    return ::remove(path) == 0 || errno == ENOENT ? 0 : -1;
  };
  if (::nftw(p.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
    io_error("cannot remove", p);
}

void remove_checkpoint(const fs::path& p) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(p, ec))) return;
  const fs::path doomed = p.parent_path() / (".tmp-removed-" + p.filename().string());
  remove_tree(doomed);  // left over from a removal a crash interrupted
  fs::rename(p, doomed);
  remove_tree(doomed);
}

bool is_complete(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p / "manifest.json", ec)) return false;
  try {
    const std::vector<char> text = read_bytes(p / "manifest.json");
    return parse_manifest(std::string(text.begin(), text.end()), (p / "manifest.json").string()).step == step_of(p);
  } catch (const ConfigError&) {
    return false;
  }
}

void prune(const fs::path& root, int64_t step, int64_t keep) {
  std::vector<std::pair<int64_t, fs::path>> older;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp-step-", 0) == 0 || name.rfind(".tmp-removed-", 0) == 0) {
      remove_tree(e.path());
      continue;
    }
    const int64_t s = step_of(e.path());
    if (s < 0 || s >= step) continue;
    // Only what is verifiably a complete checkpoint is pruned: a damaged one is the user's to
    // look at (it may be the one they meant to resume from), never deleted behind their back.
    if (is_complete(e.path())) older.emplace_back(s, e.path());
    else
      THETAD_LOG(warn, "ckpt") << e.path().string() << " is not a complete checkpoint (no valid manifest.json); "
                               << "checkpoint.keep leaves it alone: remove it yourself once you no longer need it";
  }
  std::sort(older.begin(), older.end());
  const size_t keep_older = keep > 1 ? static_cast<size_t>(keep - 1) : 0;
  for (size_t i = 0; i + keep_older < older.size(); ++i) remove_checkpoint(older[i].second);
}

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

namespace {

// "pid 123 on host since": what this process writes into the locks it holds.
std::string lock_tag() {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  return "pid " + std::to_string(::getpid()) + " on " + host + " since";
}

}  // namespace

void check_lock_held(const std::string& dir, int64_t step) {
  const fs::path lock = fs::path(dir) / ".lock";
  std::error_code ec;
  std::string why;
  if (!fs::is_directory(dir, ec)) {
    why = "the directory is gone";
  } else if (!fs::is_regular_file(lock, ec)) {
    why = "its .lock is gone";
  } else {
    std::ifstream in(lock);
    std::string holder((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (holder.find(lock_tag()) == std::string::npos)
      why = "its .lock is another's now (" + holder.substr(0, 200) + ")";
  }
  if (why.empty()) return;
  throw Error("checkpoint.dir " + dir + ": " + why + ": it was removed or replaced while this job ran; the checkpoint "
              "of step " + std::to_string(step) + " is not written (writing on would recreate the directory without "
              "its lock, or publish over another job's steps); this job stops");
}

std::string checksum_part(int rank) { return "checksums-rank-" + std::to_string(rank) + ".txt"; }

}  // namespace ckpt_files

using namespace ckpt_files;

std::optional<CheckpointInfo> find_latest_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return std::nullopt;
  // Every step-* directory counts, complete or not: a write in progress is named .tmp-step-*
  // until it is complete, so a step-* directory without its manifest was damaged since. Resume
  // never goes past it silently to an older one: it reads the newest and refuses its damage.
  std::optional<CheckpointInfo> best;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const int64_t step = step_of(entry.path());
    if (step < 0) continue;
    if (!best || step > best->step) best = CheckpointInfo{entry.path().string(), step};
  }
  if (best && !fs::exists(fs::symlink_status(fs::path(best->path) / "manifest.json", ec)))
    throw ConfigError(best->path + "/manifest.json: missing: the newest checkpoint in " + dir +
                      " is damaged (its manifest was removed or lost); resume never skips it silently: move " +
                      best->path + " out of " + dir + " to resume from the one before it, or start anew with "
                      "--no-resume");
  return best;
}

std::string checkpoint_path(const std::string& dir, int64_t step) { return (fs::path(dir) / step_name(step)).string(); }

CheckpointDirLock::CheckpointDirLock(const std::string& dir, const std::string& job_name) {
  const auto refuse = [&](const std::string& why) {
    throw ConfigError("checkpoint.dir " + dir + ": " + why + " (found before any step)");
  };
  // Made private where missing (0700); one that exists must be this user's own directory, and
  // its lock this user's own regular file: a link or a file another user planted is refused.
  if (const std::string why = safe_file::make_dirs(dir, true); !why.empty()) {
    struct stat st {};
    refuse(::stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode) ? "exists and is not a directory" : why);
  }
  const fs::path lock = fs::path(dir) / ".lock";
  std::string why;
  fd_ = safe_file::open_own(lock.string(), O_RDWR, 0644, &why);
  if (fd_ < 0) refuse(lock.string() + ": not writable: " + why);
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
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &utc);
  const std::string who = "job " + job_name + ", " + lock_tag() + " " + stamp;
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, who.data(), who.size(), 0) != static_cast<ssize_t>(who.size()))
    refuse(std::string("not writable: ") + std::strerror(errno));
  // The checkpoints themselves need files written and synced in it: prove it now, not after training.
  std::string probe;
  const int pfd = safe_file::create_unique(dir, ".write-probe-", "", &probe);
  const bool written = pfd >= 0 && ::write(pfd, who.data(), who.size()) == static_cast<ssize_t>(who.size()) &&
                       ::fsync(pfd) == 0;
  const int err = errno;
  if (pfd >= 0) {
    ::close(pfd);
    ::unlink(probe.c_str());
  }
  if (!written) refuse(std::string("not writable: ") + std::strerror(err));
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

std::string set_aside_checkpoints(const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return "";
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(dir, ec))
    // The best adapters of export.best: eval_loss (daemon/train/best_adapters) go with them.
    if (step_of(e.path()) >= 0 || e.path().filename() == "best-eval") found.push_back(e.path());
  if (found.empty()) return "";
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  fs::path aside = fs::path(dir) / (std::string("previous-") + stamp);
  for (int i = 1; fs::exists(fs::symlink_status(aside)); ++i)
    aside = fs::path(dir) / (std::string("previous-") + stamp + "-" + std::to_string(i));
  if (::mkdir(aside.c_str(), 0700) != 0) io_error("cannot create", aside);
  for (const auto& p : found) fs::rename(p, aside / p.filename());
  sync_dir(aside);
  sync_dir(dir);
  return aside.string();
}

}  // namespace thetad::daemon
