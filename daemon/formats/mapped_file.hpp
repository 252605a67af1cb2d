// A read-only memory map of a whole regular file (safetensors checkpoints, flat token files):
// move-only, unmapped on destruction; errors name the file.
#pragma once

#include <cstddef>
#include <string>

namespace thetad::daemon {

class MappedFile {
 public:
  // Maps `path`; ConfigError "PATH: cannot open: ..." (missing, not a regular file, empty when
  // `allow_empty` is false, mmap failure).
  static MappedFile open(const std::string& path, bool allow_empty = false);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::string& path() const { return path_; }
  const char* data() const { return static_cast<const char*>(map_); }
  size_t size() const { return size_; }

 private:
  void reset() noexcept;
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
};

}  // namespace thetad::daemon
