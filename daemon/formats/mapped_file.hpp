// A read-only memory map of a whole regular file (safetensors checkpoints, .npy arrays): move-only,
// unmapped on destruction; errors name the file. Reads out of the map go through `read`, which
// turns a file shortened by another process while it is mapped (a model rewritten in a shared hub
// cache, a data file rewritten in place) into a ConfigError instead of SIGBUS, and a file written
// into in place (whose new bytes a private map would show, mixed with the old) into one too.
//
//   map.read("tensor 'w'", [&] { std::memcpy(dst, map.data() + at, n); });  // ConfigError if short
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "common/file_read.hpp"

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

  // Runs `copy()`, which reads this map (copies or converts bytes out of it into memory the caller
  // owns), so that the file found shorter than when it was mapped is ConfigError
  // "PATH: WHAT: cannot be read: the file is now N bytes, M when it was opened (...)" on this
  // thread, and the file found written into since (a new modification time) ConfigError
  // "PATH: WHAT: cannot be read: the file was modified after thetad opened it (...)". A page past
  // the file's new end (SIGBUS) ends `copy` there, and a new end within the last page read (zeros
  // there) is found by the size checked after it. Any thread may read at once. `copy` must own
  // nothing that needs destroying (no std::string, no vector): a short file leaves it by a jump,
  // not by a return or an exception. An exception `copy` throws passes.
  template <typename F>
  void read(const std::string& what, F&& copy) const {
    using Fn = std::remove_reference_t<F>;
    check_read(what, read_guarded(&call<Fn>, &copy));
  }

 private:
  template <typename Fn>
  static void call(void* fn) { (*static_cast<Fn*>(fn))(); }
  // fn(arg) with a SIGBUS of this thread inside [data(), data() + size()) caught: false then
  // (mapped_file_guard.cpp).
  bool read_guarded(void (*fn)(void*), void* arg) const;
  // Throws the ConfigError of `read` unless `completed` and the file still has its size.
  void check_read(const std::string& what, bool completed) const;
  void reset() noexcept;
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  // The mapped file as it was mapped, to tell it from another put in its place or from itself
  // written into since (check_read). No descriptor is held: a job may map thousands of files.
  FileVersion version_;
};

}  // namespace thetad::daemon
