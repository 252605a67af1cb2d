// The file-level pieces shared by the checkpoint writer, reader and directory logic: durable
// writes (fsync before rename), directory syncs, step-directory names and keep-N pruning.
// Internal to daemon/state/ (checkpoint.hpp is the interface).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace thetad::daemon::ckpt_files {

namespace fs = std::filesystem;

// "step-00000040".
std::string step_name(int64_t step);
// Completed steps of a checkpoint directory's name, or -1.
int64_t step_of(const fs::path& p);
// Error "checkpoint: <what> <p>: <strerror(errno)>".
[[noreturn]] void io_error(const std::string& what, const fs::path& p);
// Writes the file under path.part, on disk (fsync) before it takes its name: a crash leaves the
// old contents or the new ones, never a torn file.
void write_file_durable(const fs::path& path, const std::vector<char>& bytes);
// A file written in pieces under path.part, then synced and renamed (as write_file_durable):
// a crash leaves the old contents or the new ones. Removed (.part) unless committed.
class DurableFile {
 public:
  explicit DurableFile(const fs::path& path);
  ~DurableFile();
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;
  // False on an error (errno kept for fail).
  bool write(const char* p, size_t n);
  // n bytes at `offset` (pwrite): any thread, any order; false on an error (the first one's
  // errno kept for fail).
  bool write_at(const char* p, size_t n, uint64_t offset);
  // Starts the writeback of bytes written (sync_file_range, where there is one), so that the
  // disk is busy while the rest is written and commit's fsync waits for little.
  void start_writeback(uint64_t offset, uint64_t n);
  // Error "checkpoint: short write to <path.part>: <strerror>" (a write failed) or `what`.
  [[noreturn]] void fail(const std::string& what);
  void commit();  // fsync, close, rename

 private:
  fs::path path_, part_;
  int fd_ = -1;
  std::atomic<int> errno_{0};
  void keep_errno(int e);
};
// Whether the file `from` still matches `checksum` (formats 5 and 6's, file_checksum.hpp), read
// in blocks on `threads` threads: false where its bytes differ or it is missing or shorter now.
bool file_matches(const fs::path& from, uint64_t checksum, int threads);
// The checkpoint directories under `root` (step-*, by name) holding the file `p` is (the same
// inode: hard links), `p`'s own included.
std::vector<std::string> checkpoints_holding(const fs::path& p, const fs::path& root);
// Shares `from` (a file of the newest complete checkpoint, verified by file_matches) as `to`: a
// hard link, or where the filesystem refuses one (EXDEV, EPERM, no links), a durable copy, said
// once per process in the log. Returns whether it linked. Error naming `from` where it cannot
// be read (removed since).
bool link_or_copy(const fs::path& from, const fs::path& to);
// A directory's entries (creations, renames) on disk.
void sync_dir(const fs::path& dir);
// Removes `p` with everything under it; a missing `p` is no error (io_error otherwise). Not
// std::filesystem::remove_all, which crashed thetad on the GPU image (see checkpoint_dir.cpp).
void remove_tree(const fs::path& p);
// Removes checkpoint directory `p` so that a crash never leaves it half removed (a step-*
// directory without its manifest would read as damaged): renamed to .tmp-removed-<name> first.
void remove_checkpoint(const fs::path& p);
// After publishing `step`: keeps the newest `keep` checkpoints up to it (it included) and drops
// the temporary directories of interrupted writes and removals. Newer checkpoints, if any, are
// left alone, and so is any step-* directory without a valid manifest (logged as a warning).
void prune(const fs::path& root, int64_t step, int64_t keep);
// A checkpoint file's bytes; ConfigError naming it where it cannot be read whole.
std::vector<char> read_bytes(const fs::path& p);
// Rank 0, before each checkpoint: checkpoint.dir still holds this process's lock (CheckpointDirLock
// wrote "pid P on HOST since ..." into dir/.lock). A directory removed while the job ran (and
// perhaps recreated and locked by another job) throws Error naming it: writing on would recreate
// it without the lock, or publish over the other job's steps.
void check_lock_held(const std::string& dir, int64_t step);
// The file in which rank `rank` leaves its shards' checksums for rank 0's manifest.
std::string checksum_part(int rank);

}  // namespace thetad::daemon::ckpt_files
