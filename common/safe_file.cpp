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
  return create_unique_at(AT_FDCWD, dir + (!dir.empty() && dir.back() == '/' ? "" : "/") + prefix, suffix, path, mode);
}

int create_unique_at(int dir, const std::string& prefix, const std::string& suffix, std::string* name, mode_t mode) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    const std::string n = prefix + random_name(8) + suffix;
    const int fd = ::openat(dir, n.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd >= 0 || errno != EEXIST) {
      if (fd >= 0 && name) *name = n;
      return fd;
    }
  }
  errno = EEXIST;
  return -1;
}

namespace {

EntryCheck check_stat(const struct stat& st, EntryRules rules) {
  EntryCheck c;
  if (S_ISLNK(st.st_mode)) c.problem = EntryCheck::link;
  else if (rules.devices && S_ISCHR(st.st_mode)) return c;
  else if (!S_ISREG(st.st_mode)) c.problem = EntryCheck::not_regular;
  else if (st.st_uid != ::geteuid()) c.problem = EntryCheck::other_owner, c.uid = st.st_uid;
  else if (rules.one_link && st.st_nlink != 1) c.problem = EntryCheck::other_links;
  return c;
}

}  // namespace

EntryCheck check_entry_at(int dir, const std::string& name, EntryRules rules) {
  struct stat st {};
  if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return {EntryCheck::error, 0, errno};
  return check_stat(st, rules);
}

int open_own_at(int dir, const std::string& name, int flags, mode_t mode, EntryRules rules, EntryCheck* check) {
  const int fd = ::openat(dir, name.c_str(), flags | O_CREAT | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) {
    const int err = errno;
    struct stat st {};
    *check = err == ELOOP && ::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)
                 ? EntryCheck{EntryCheck::link, st.st_uid, 0}
                 : EntryCheck{EntryCheck::error, 0, err};
    return -1;
  }
  struct stat st {};
  *check = ::fstat(fd, &st) != 0 ? EntryCheck{EntryCheck::error, 0, errno} : check_stat(st, rules);
  if (check->problem == EntryCheck::none) return fd;
  ::close(fd);
  return -1;
}

int open_own(const std::string& path, int flags, mode_t mode, std::string* why) {
  EntryCheck c;
  const int fd = open_own_at(AT_FDCWD, path, flags, mode, {/*one_link=*/false, /*devices=*/true}, &c);
  switch (c.problem) {
    case EntryCheck::none: break;
    case EntryCheck::link: *why = "is a symbolic link (thetad writes no output through a link: name the file itself)"; break;
    case EntryCheck::not_regular: *why = "is not a regular file"; break;
    case EntryCheck::other_owner:
      *why = "is owned by uid " + std::to_string(c.uid) + ", not by this user (uid " + std::to_string(::geteuid()) +
             "); thetad writes only into files of its own";
      break;
    case EntryCheck::other_links:  // not asked for
    case EntryCheck::error: *why = std::strerror(c.err); break;
  }
  return fd;
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
