// Output files and directories safe from planted links and files (see safe_file.hpp).
#include "common/safe_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

namespace thetad::safe_file {
namespace {

std::string random_name(size_t n) {
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 gen{std::random_device{}() ^ static_cast<uint64_t>(::getpid())};
  std::string s(n, 'x');
  for (char& c : s) c = kChars[gen() % (sizeof kChars - 1)];
  return s;
}

std::string parent_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string error_text(const std::string& what, int err) { return what + ": " + std::strerror(err); }

}  // namespace

int create_fresh(const std::string& path, mode_t mode) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) (void)::unlink(path.c_str());
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
}

int create_unique(const std::string& dir, const std::string& prefix, const std::string& suffix, std::string* path,
                  mode_t mode) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    const std::string p = dir + (!dir.empty() && dir.back() == '/' ? "" : "/") + prefix + random_name(8) + suffix;
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd >= 0 || errno != EEXIST) {
      if (fd >= 0 && path) *path = p;
      return fd;
    }
  }
  errno = EEXIST;
  return -1;
}

int open_own(const std::string& path, int flags, mode_t mode, std::string* why) {
  const int fd = ::open(path.c_str(), flags | O_CREAT | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) {
    struct stat st {};
    *why = errno == ELOOP && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)
               ? "is a symbolic link (thetad writes no output through a link: name the file itself)"
               : std::string(std::strerror(errno));
    return -1;
  }
  struct stat st {};
  std::string wrong;
  if (::fstat(fd, &st) != 0) wrong = std::strerror(errno);
  else if (S_ISCHR(st.st_mode)) return fd;  // a device the user named (/dev/null, /dev/full): no one plants those
  else if (!S_ISREG(st.st_mode)) wrong = "is not a regular file";
  else if (st.st_uid != ::geteuid())
    wrong = "is owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " + std::to_string(::geteuid()) +
            "); thetad writes only into files of its own";
  if (wrong.empty()) return fd;
  ::close(fd);
  *why = wrong;
  return -1;
}

std::string make_dirs(const std::string& path, bool own) {
  if (path.empty()) return "";
  // Each missing component, from the top: 0700, where the umask allows no more anyway.
  for (size_t at = path.find('/', 1);; at = path.find('/', at + 1)) {
    const std::string part = at == std::string::npos ? path : path.substr(0, at);
    if (!part.empty() && ::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) return error_text("cannot create " + part, errno);
    if (at == std::string::npos) break;
  }
  struct stat link {}, st {};
  if (::lstat(path.c_str(), &link) != 0) return error_text(path, errno);
  if (::stat(path.c_str(), &st) != 0) return error_text(path, errno);
  if (!S_ISDIR(st.st_mode)) return path + ": exists and is not a directory";
  if (!own) return "";
  const uid_t me = ::geteuid();
  if (S_ISLNK(link.st_mode) && link.st_uid != me)
    return path + ": is a symbolic link of uid " + std::to_string(link.st_uid) + ", not of this user (uid " +
           std::to_string(me) + "); thetad follows no other user's link to its output";
  if (st.st_uid != me)
    return path + ": is owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " + std::to_string(me) +
           "); thetad writes its output only into directories of its own";
  return "";
}

std::string probe_writable(const std::string& dir) {
  std::string at = dir.empty() ? "." : dir;
  struct stat st {};
  while (::stat(at.c_str(), &st) != 0) {
    if (errno != ENOENT && errno != ENOTDIR) return error_text(at, errno);
    const std::string up = parent_of(at);
    if (up == at) return error_text(at, ENOENT);
    at = up;
  }
  if (!S_ISDIR(st.st_mode)) return at + ": is not a directory";
  std::string probe;
  const int fd = create_unique(at, ".thetad-probe-", "", &probe);
  if (fd < 0) return error_text(at + ": cannot create a file there", errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

}  // namespace thetad::safe_file
