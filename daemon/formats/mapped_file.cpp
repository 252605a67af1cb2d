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
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw ConfigError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  std::string problem;
  if (::fstat(fd, &st) != 0) problem = std::string("cannot stat: ") + std::strerror(errno);
  else if (!S_ISREG(st.st_mode)) problem = "not a regular file";
  else if (st.st_size == 0 && !allow_empty) problem = "empty file";
  if (problem.empty() && st.st_size > 0) {
    f.size_ = static_cast<size_t>(st.st_size);
    void* m = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) problem = std::string("cannot mmap: ") + std::strerror(errno);
    else f.map_ = m;
  }
  ::close(fd);  // the mapping keeps the file alive
  if (!problem.empty()) throw ConfigError(path + ": " + problem);
  return f;
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
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
