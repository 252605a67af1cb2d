// MappedFile (see mapped_file.hpp).
#include "daemon/formats/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/errors.hpp"
#include "common/file_read.hpp"

namespace thetad::daemon {

MappedFile MappedFile::open(const std::string& path, bool allow_empty) {
  MappedFile f;
  f.path_ = path;
  // O_NONBLOCK: a FIFO opens at once (then is refused as not a regular file) instead of waiting
  // for a writer forever; a regular file's reads ignore it. The descriptor is closed once the
  // file is mapped: a job may map a file or two per task, thousands.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw ConfigError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  std::string problem;
  if (::fstat(fd, &st) != 0) problem = std::string("cannot stat: ") + std::strerror(errno);
  else if (!S_ISREG(st.st_mode)) problem = "not a regular file";
  else if (st.st_size == 0 && !allow_empty) problem = "empty file";
  if (problem.empty() && st.st_size > 0) {
    void* m = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) problem = std::string("cannot mmap: ") + std::strerror(errno);
    else f.map_ = m, f.size_ = static_cast<size_t>(st.st_size);
  }
  ::close(fd);
  if (!problem.empty()) throw ConfigError(path + ": " + problem);
  f.version_ = file_version(st);
  return f;
}

void MappedFile::check_read(const std::string& what, bool completed) const {
  // The mapped file's size now, found by its name: the same file (device and inode) still there.
  // A file put in its place by a rename leaves the mapped one as it was: a completed read stands.
  struct stat st {};
  const bool found = ::stat(path_.c_str(), &st) == 0;
  const FileVersion now_version = found ? file_version(st) : FileVersion{};
  const bool same = found && now_version.same_file(version_);
  const bool whole = !same || static_cast<size_t>(st.st_size) >= size_;
  // Written into in place (same file, a new modification time): a private map shows the new bytes
  // of every page it has not copied, so reads would mix the file as it was with the file as it is.
  const bool written = same && whole && !now_version.same_version(version_);
  if (completed && whole && !written) return;
  if (written)
    throw ConfigError(path_ + ": " + what + ": cannot be read: the file was modified after thetad opened it "
                      "(another process wrote into it while the job read it; a model or data file must stay as it "
                      "is while the job reads it: write a new file and rename it into place instead)");
  const std::string now = same ? "now " + std::to_string(st.st_size) + " bytes" : "shorter now";
  throw ConfigError(path_ + ": " + what + ": cannot be read: the file is " + now + ", " + std::to_string(size_) +
                    " when it was opened (another process truncated or rewrote it while thetad read it; "
                    "a model or data file must stay as it is while the job reads it)");
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
    version_ = other.version_;
  }
  return *this;
}

MappedFile::~MappedFile() { reset(); }

void MappedFile::reset() noexcept {
  if (map_) ::munmap(map_, size_);
  map_ = nullptr;
  size_ = 0;
}

}  // namespace thetad::daemon
