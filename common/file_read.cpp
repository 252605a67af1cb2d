// read_regular_file and link_outside (see file_read.hpp).
#include "common/file_read.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "common/text.hpp"

namespace thetad {

FileVersion file_version(const struct stat& st) {
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
          int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec};
}

namespace {

ReadResult failed(ReadFailure f, std::string why) { return {f, std::move(why)}; }

ReadResult not_regular(unsigned mode) {
  return failed(ReadFailure::not_regular,
                S_ISDIR(mode) ? std::string("it is a directory") : "not a regular file (" + file_kind_name(mode) + ")");
}

// The canonical form of `p` (links resolved), or "" with errno set.
std::string real(const std::string& p) {
  char* r = ::realpath(p.c_str(), nullptr);
  if (!r) return "";
  std::string out(r);
  std::free(r);
  return out;
}

bool within(const std::string& path, const std::string& root) {
  return !root.empty() && path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
         (root.back() == '/' || path[root.size()] == '/');
}

}  // namespace

std::string file_kind_name(unsigned mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  return "not a plain file";
}

ReadResult read_regular_file(const std::string& path, size_t max_bytes, FileBytes& out) {
  out.buf_.reset();
  out.size_ = 0;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return failed(ReadFailure::io, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return not_regular(st.st_mode);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return failed(ReadFailure::io, std::strerror(errno));
  ReadResult result;
  if (::fstat(fd, &st) != 0) {
    result = failed(ReadFailure::io, std::strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    result = not_regular(st.st_mode);
  } else {
    // Room for the whole file and one byte more (a file that grew, or one above the bound, shows
    // there); grown where the size was wrong (files of /proc say 0).
    const size_t limit = max_bytes == SIZE_MAX ? SIZE_MAX : max_bytes + 1;
    size_t cap = std::min(static_cast<size_t>(st.st_size), limit - 1) + 1, n = 0;
    std::unique_ptr<char[]> buf(new char[cap]);
    while (true) {
      if (n == cap) {
        if (cap == limit) break;
        const size_t grown = cap > limit / 2 ? limit : std::max<size_t>(2 * cap, 4096);
        std::unique_ptr<char[]> bigger(new char[grown]);
        std::memcpy(bigger.get(), buf.get(), n);
        buf = std::move(bigger);
        cap = grown;
      }
      const ssize_t r = ::read(fd, buf.get() + n, std::min<size_t>(cap - n, size_t{1} << 30));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        result = failed(ReadFailure::io, std::strerror(errno));
        break;
      }
      if (r == 0) break;
      n += static_cast<size_t>(r);
    }
    if (result && n > max_bytes) {
      result = failed(ReadFailure::too_large, "larger than " + std::to_string(max_bytes) + " bytes");
    } else if (result) {
      out.buf_ = std::move(buf);
      out.size_ = n;
    }
  }
  ::close(fd);
  return result;
}

ReadResult read_regular_file(const std::string& path, size_t max_bytes, std::string& out) {
  FileBytes bytes;
  ReadResult r = read_regular_file(path, max_bytes, bytes);
  out.assign(bytes.data() ? bytes.data() : "", bytes.size());
  return r;
}

std::string link_outside(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return "";
  const std::string target = real(path);
  if (target.empty()) return std::string("a symbolic link that cannot be resolved: ") + std::strerror(errno);
  const std::string root = real(dir);
  if (within(target, root)) return "";
  // A Hugging Face cache: REPO/snapshots/REVISION/NAME -> ../../blobs/HASH.
  const size_t slash = root.rfind('/');
  const std::string parent = slash == std::string::npos ? "" : root.substr(0, slash);
  const size_t slash2 = parent.rfind('/');
  if (slash2 != std::string::npos && parent.compare(slash2 + 1, std::string::npos, "snapshots") == 0 &&
      within(target, parent.substr(0, slash2) + "/blobs"))
    return "";
  return "a symbolic link to " + printable(target) + ", outside " + printable(root) +
         " (thetad follows links in a model or adapter directory only to files within it, or within "
         "the blobs/ folder of the Hugging Face cache it is a snapshot of)";
}

}  // namespace thetad
