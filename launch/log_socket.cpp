// The launcher's log socket and its checks (see log_socket.hpp).
#include "launch/log_socket.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "launch/hostfile.hpp"

namespace thetad::launch {

namespace {

constexpr size_t kTokenBytes = 32;

bool fill_address(const std::string& path, sockaddr_un& addr) {
  addr = sockaddr_un{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) return false;
  std::memcpy(addr.sun_path, path.data(), path.size());
  return true;
}

bool peer_of(int fd, pid_t& pid, uid_t& uid) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  pid = cred.pid;
  uid = cred.uid;
  return true;
}

// A fresh directory of this user's that no one else may enter, under `base`.
std::string private_temp_dir(const std::string& base, std::string& why) {
  std::string tmpl = base + "/thetad-launch.XXXXXX";
  if (!::mkdtemp(tmpl.data())) {
    why = "cannot create a directory in " + base + ": " + std::strerror(errno);
    return "";
  }
  // mkdtemp made it (0700, O_EXCL-like); checked all the same before a socket goes in it.
  Fd d(::open(tmpl.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (!d || ::fstat(d.get(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
      (st.st_mode & 077) != 0) {
    why = tmpl + " is not a private directory of this user's";
    return "";
  }
  return tmpl;
}

}  // namespace

LogListener::LogListener() {
  // $TMPDIR when its path leaves room for the socket's name (sun_path: 108 bytes), else /tmp.
  const char* tmp = std::getenv("TMPDIR");
  std::string base = tmp && *tmp == '/' && std::strlen(tmp) < 64 ? tmp : "/tmp";
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  dir_ = private_temp_dir(base, why_);
  if (dir_.empty()) return;
  path_ = dir_ + "/log.sock";
  token_ = random_hex(kTokenBytes);
  sockaddr_un addr;
  Fd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s || !fill_address(path_, addr)) {
    why_ = "cannot create a unix socket";
    return;
  }
  const mode_t old = ::umask(0177);  // the socket file 0600
  const int rc = ::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::umask(old);
  if (rc != 0 || ::listen(s.get(), 1024) != 0) {
    why_ = "cannot listen on " + path_ + ": " + std::strerror(errno);
    return;
  }
  fd_ = std::move(s);
}

LogListener::~LogListener() {
  fd_.reset();
  if (!path_.empty()) ::unlink(path_.c_str());
  if (!dir_.empty()) ::rmdir(dir_.c_str());
}

LogListener::Peer LogListener::accept(std::string& refused) {
  for (;;) {
    Peer p;
    p.fd.reset(::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!p.fd) return p;
    if (!peer_of(p.fd.get(), p.pid, p.uid)) continue;
    if (p.uid == ::geteuid()) return p;
    refused = "refused a log connection from uid " + std::to_string(p.uid) + " (pid " + std::to_string(p.pid) +
              "): not this user";
    return Peer{};
  }
}

std::string hello_line(const std::string& token, int rank) { return token + " " + std::to_string(rank) + "\n"; }

int check_hello(const std::string& line, const std::string& token, int ranks, std::string& why) {
  const size_t space = line.find(' ');
  const std::string given = line.substr(0, space);
  // Constant time: how much of a guess matched must not show in how long the refusal took.
  unsigned char diff = given.size() == token.size() ? 0 : 1;
  for (size_t i = 0; i < token.size(); ++i) diff |= static_cast<unsigned char>(token[i] ^ given[i % (given.size() + 1)]);
  if (diff != 0 || space == std::string::npos) {
    why = "without the launch's token";
    return -1;
  }
  const long rank = line.substr(space + 1) == "0" ? 0 : parse_count(line.substr(space + 1));
  if (rank < 0 || rank >= ranks) {
    why = "naming no rank of this launch";
    return -1;
  }
  return int(rank);
}

Fd connect_log_socket(const std::string& path, const std::string& token, int rank, std::string& why) {
  sockaddr_un addr;
  Fd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s || !fill_address(path, addr)) {
    why = "no usable socket path";
    return Fd();
  }
  if (::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    // None there (the launcher runs on another host): the lines go to stderr, quietly.
    why = errno == ENOENT || errno == ECONNREFUSED ? "" : path + ": " + std::strerror(errno);
    return Fd();
  }
  pid_t pid = -1;
  uid_t uid = 0;
  if (!peer_of(s.get(), pid, uid) || uid != ::geteuid()) {
    why = path + " is served by uid " + std::to_string(uid) + " (pid " + std::to_string(pid) +
          "), not this user: the rank's lines are not sent there";
    return Fd();
  }
  const std::string hello = hello_line(token, rank);
  if (::send(s.get(), hello.data(), hello.size(), MSG_NOSIGNAL) != ssize_t(hello.size())) {
    why = path + ": " + std::strerror(errno);
    return Fd();
  }
  return s;
}

}  // namespace thetad::launch
