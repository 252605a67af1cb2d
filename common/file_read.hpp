// Reading files whose contents and kind come from others (a job file, a model directory's JSON,
// a state dict): regular files only, refused before they are opened (a FIFO would block the
// open, a device never ends), read whole up to a bound, and symbolic links kept within the
// directory that names them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

struct stat;

namespace thetad {

// A file as a reader found it (from stat): which file it is (device and inode: another put in its
// place by a rename differs) and when it was last written (to the nanosecond: a write into it in
// place changes it). A reader that keeps a file for the whole job compares it with the file as it
// is now, so that a model or data file changed under the job is an error, not bytes of two files.
struct FileVersion {
  uint64_t device = 0, inode = 0;
  int64_t modified_ns = 0;
  bool same_file(const FileVersion& o) const { return device == o.device && inode == o.inode; }
  bool same_version(const FileVersion& o) const { return same_file(o) && modified_ns == o.modified_ns; }
};
FileVersion file_version(const struct stat& st);

enum class ReadFailure {
  none,
  not_regular,  // a directory, FIFO, socket or device: `why` says which
  too_large,    // more than max_bytes
  io,           // stat, open or read failed: `why` is the system's message (strerror)
};

struct ReadResult {
  ReadFailure failure = ReadFailure::none;
  std::string why;  // "" when read; else e.g. "not a regular file (a FIFO)", "Permission denied"
  explicit operator bool() const { return failure == ReadFailure::none; }
};

// A file's bytes in one allocation that is not zero-filled first (a state dict of gigabytes is
// read once, not written twice).
class FileBytes {
 public:
  const char* data() const { return buf_.get(); }
  char* data() { return buf_.get(); }
  size_t size() const { return size_; }

 private:
  friend ReadResult read_regular_file(const std::string& path, size_t max_bytes, FileBytes& out);
  std::unique_ptr<char[]> buf_;
  size_t size_ = 0;
};

// Reads the regular file `path` into `out` (replaced), at most `max_bytes` of it: a larger file
// is too_large (no more than max_bytes + 1 bytes read). The kind is checked with stat before the
// open and again on the open descriptor (opened non-blocking, so that a FIFO put in its place in
// between is refused, not waited on).
ReadResult read_regular_file(const std::string& path, size_t max_bytes, FileBytes& out);
// The same into a string (text files: a job, a JSON document).
ReadResult read_regular_file(const std::string& path, size_t max_bytes, std::string& out);

// The kind of a file that is not a regular one, from its st_mode, for messages: "a FIFO", ...
std::string file_kind_name(unsigned mode);

// Where `dir` names the file `name` (one component: a model's index, a PEFT adapter directory),
// the file may be a symbolic link only to a file within `dir`, or, when `dir` is a snapshot of a
// Hugging Face cache (.../snapshots/REVISION), within that repository's blobs/ folder (where the
// cache's links point). Returns "" when `dir/name` is not a link, is such a link, or does not
// exist (the reader reports that); else the problem: "a symbolic link to TARGET, outside ..." or
// the system's message for a link that cannot be resolved.
std::string link_outside(const std::string& dir, const std::string& name);

}  // namespace thetad
