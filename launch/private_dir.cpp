// Private run directories and files relative to them (see private_dir.hpp).
#include "launch/private_dir.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/errors.hpp"
#include "common/safe_file.hpp"

namespace thetad::launch {

namespace {

bool trusted_owner(uid_t uid) { return uid == 0 || uid == ::geteuid(); }

// Every user may write it, and without the sticky bit any of them may replace its entries.
bool open_to_all(const struct stat& st) { return (st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX); }

std::string mode_text(const struct stat& st) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04o", unsigned(st.st_mode & 07777));
  return buf;
}

std::vector<std::string> path_parts(const std::string& abs) {
  std::vector<std::string> parts;
  size_t start = 1;
  while (start < abs.size()) {
    size_t slash = abs.find('/', start);
    if (slash == std::string::npos) slash = abs.size();
    if (slash > start) parts.push_back(abs.substr(start, slash - start));
    start = slash + 1;
  }
  return parts;
}

}  // namespace

Fd open_private_dir(const std::string& path, bool create, const std::string& what) {
  // Lexically absolute: resolving links first (realpath) would skip the checks of each link.
  const std::string abs = normalize_path(path);
  const uid_t me = ::geteuid();
  Fd dir(::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  struct stat parent {};
  if (!dir || ::fstat(dir.get(), &parent) != 0) throw Error("cannot open '/': " + std::string(std::strerror(errno)));
  const auto parts = path_parts(abs);
  if (parts.empty()) throw ConfigError(what + " '" + path + "': '/' cannot be one");
  std::string sofar;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& name = parts[i];
    sofar += "/" + name;
    const bool last = i + 1 == parts.size();
    const auto refuse = [&](const std::string& why) {
      throw ConfigError(what + " '" + path + "': '" + sofar + "' " + why);
    };
    struct stat st {};
    if (::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT || !create) refuse(std::string(": ") + std::strerror(errno));
      if (::mkdirat(dir.get(), name.c_str(), 0700) != 0 && errno != EEXIST)
        refuse(std::string("cannot be created: ") + std::strerror(errno));
      if (::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) refuse(std::strerror(errno));
    }
    const bool shared_parent = (parent.st_mode & S_IWOTH) != 0;  // sticky: checked at the parent
    Fd next;
    if (S_ISLNK(st.st_mode)) {
      if (!trusted_owner(st.st_uid))
        refuse("is a symbolic link owned by uid " + std::to_string(st.st_uid) + " (not you or root): not followed");
      next.reset(::openat(dir.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    } else {
      if (shared_parent && !trusted_owner(st.st_uid))
        refuse("is owned by uid " + std::to_string(st.st_uid) +
               " (not you or root) in a directory every user may write: anyone could have put it there");
      next.reset(::openat(dir.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    }
    if (!next) refuse(errno == ENOTDIR ? "is not a directory" : std::strerror(errno));
    if (::fstat(next.get(), &st) != 0) refuse(std::strerror(errno));  // what was opened
    if (!S_ISDIR(st.st_mode)) refuse("is not a directory");
    if (open_to_all(st))
      refuse("can be written by every user (mode " + mode_text(st) +
             ") and has no sticky bit: anyone could replace what is in it; choose a directory elsewhere");
    if (last && st.st_uid != me)
      refuse("is owned by uid " + std::to_string(st.st_uid) + ", not by you (uid " + std::to_string(me) + ")");
    if (last && (st.st_mode & S_IWOTH))
      refuse("can be written by every user (mode " + mode_text(st) + "): chmod o-w it, or choose another");
    parent = st;
    dir = std::move(next);
  }
  return dir;
}

namespace {

constexpr safe_file::EntryRules kOwnFile{/*one_link=*/true, /*devices=*/false};

// The launcher's words for what safe_file found wrong with an entry ("" for nothing).
std::string entry_text(const safe_file::EntryCheck& c) {
  switch (c.problem) {
    case safe_file::EntryCheck::none: return "";
    case safe_file::EntryCheck::link: return "is a symbolic link";
    case safe_file::EntryCheck::not_regular: return "is not a regular file";
    case safe_file::EntryCheck::other_owner: return "is owned by uid " + std::to_string(c.uid) + ", not by you";
    case safe_file::EntryCheck::other_links: return "has other hard links";
    case safe_file::EntryCheck::error: break;
  }
  return std::strerror(c.err);
}

}  // namespace

std::string unsafe_entry(int dir, const std::string& name) {
  const safe_file::EntryCheck c = safe_file::check_entry_at(dir, name, kOwnFile);
  return c.problem == safe_file::EntryCheck::error && c.err == ENOENT ? "" : entry_text(c);
}

Fd open_append_at(int dir, const std::string& name, std::string& why) {
  // O_NONBLOCK: opening a FIFO for writing fails at once instead of waiting for a reader.
  safe_file::EntryCheck c;
  Fd fd(safe_file::open_own_at(dir, name, O_WRONLY | O_APPEND | O_NONBLOCK, 0600, kOwnFile, &c));
  if (!fd) {
    why = entry_text(c);
    return fd;
  }
  ::fcntl(fd.get(), F_SETFL, O_APPEND);  // blocking writes again
  return fd;
}

bool replace_file_at(int dir, const std::string& name, const std::string& text) {
  std::string tmp;
  Fd fd(safe_file::create_unique_at(dir, "." + name + ".", "", &tmp, 0600));
  if (!fd) return false;
  const bool ok = write_all(fd.get(), text);
  fd.reset();
  if (ok && ::renameat(dir, tmp.c_str(), dir, name.c_str()) == 0) return true;
  ::unlinkat(dir, tmp.c_str(), 0);
  return false;
}

bool read_file_at(int dir, const std::string& name, std::string& out, size_t max) {
  Fd fd(::openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  return read_fd(fd.get(), max, out);
}

std::vector<std::string> list_dir(int dir) {
  std::vector<std::string> names;
  const int copy = ::dup(dir);  // shares the offset with `dir`: rewound below
  DIR* d = copy >= 0 ? ::fdopendir(copy) : nullptr;
  if (!d) {
    if (copy >= 0) ::close(copy);
    return names;
  }
  ::rewinddir(d);
  while (dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.push_back(e->d_name);
  ::closedir(d);
  return names;
}

}  // namespace thetad::launch
