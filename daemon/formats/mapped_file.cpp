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

namespace thetad::daemon {

MappedFile MappedFile::open(const std::string& path, bool allow_empty) {
  MappedFile f;
  f.path_ = path;
  // O_NONBLOCK: a FIFO opens at once (then is refused as not a regular file) instead of waiting
  // for a writer forever; a regular file's reads ignore it.
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (f.fd_ < 0) throw ConfigError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  std::string problem;
  if (::fstat(f.fd_, &st) != 0) problem = std::string("cannot stat: ") + std::strerror(errno);
  else if (!S_ISREG(st.st_mode)) problem = "not a regular file";
  else if (st.st_size == 0 && !allow_empty) problem = "empty file";
  if (problem.empty() && st.st_size > 0) {
    void* m = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, f.fd_, 0);
    if (m == MAP_FAILED) problem = std::string("cannot mmap: ") + std::strerror(errno);
    else f.map_ = m, f.size_ = static_cast<size_t>(st.st_size);
  }
  if (!problem.empty()) throw ConfigError(path + ": " + problem);  // ~MappedFile closes the file
  return f;
}

void MappedFile::check_read(const std::string& what, bool completed) const {
  struct stat st {};
  const bool stat_ok = ::fstat(fd_, &st) == 0;
  if (completed && stat_ok && static_cast<size_t>(st.st_size) >= size_) return;
  const std::string now = stat_ok ? "now " + std::to_string(st.st_size) + " bytes" : "shorter now";
  throw ConfigError(path_ + ": " + what + ": cannot be read: the file is " + now + ", " + std::to_string(size_) +
                    " when it was opened (another process truncated or rewrote it while thetad read it; "
                    "a model file must stay as it is until the job has read it)");
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

MappedFile::~MappedFile() { reset(); }

void MappedFile::reset() noexcept {
  if (map_) ::munmap(map_, size_);
  if (fd_ >= 0) ::close(fd_);
  map_ = nullptr;
  size_ = 0;
  fd_ = -1;
}

}  // namespace thetad::daemon
