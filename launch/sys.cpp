// POSIX helpers of the launcher (see sys.hpp).
#include "launch/sys.hpp"

#include <fcntl.h>
#include <limits.h>
#include <sys/signalfd.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include "common/errors.hpp"

namespace thetad::launch {

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

int Fd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

bool write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += w;
    n -= size_t(w);
  }
  return true;
}

bool read_file(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  return true;
}

bool read_fd(int fd, size_t max, std::string& out) {
  out.clear();
  char buf[65536];
  while (out.size() < max) {
    const ssize_t r = ::read(fd, buf, std::min(sizeof buf, max - out.size()));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return false;
    if (r == 0) break;
    out.append(buf, size_t(r));
  }
  return true;
}

std::string random_hex(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    const ssize_t r = ::getrandom(&raw[got], bytes - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw Error(std::string("getrandom: ") + std::strerror(errno));
    got += size_t(r);
  }
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out += hex[c >> 4];
    out += hex[c & 15];
  }
  return out;
}

Fd pidfd_open(pid_t pid) {
#ifdef SYS_pidfd_open
  return Fd(int(::syscall(SYS_pidfd_open, pid, 0)));
#else
  (void)pid;
  return Fd();
#endif
}

bool pidfd_signal(int pidfd, pid_t pid, int sig) {
#ifdef SYS_pidfd_send_signal
  if (pidfd >= 0) return ::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0) == 0;
#endif
  return ::kill(pid, sig) == 0;
}

namespace {
void never_runs(int) {}
}  // namespace

Fd take_signals(const std::vector<int>& sigs, bool show_caught) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : sigs) sigaddset(&set, s);
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
  for (int s : sigs) {
    if (s == SIGCHLD) continue;
    struct sigaction old {};
    ::sigaction(s, nullptr, &old);
    if (old.sa_handler == SIG_IGN || show_caught) {
      struct sigaction sa {};
      sa.sa_handler = never_runs;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESTART;
      ::sigaction(s, &sa, nullptr);
    }
  }
  return Fd(::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
}

int read_signal(int sfd) {
  signalfd_siginfo info;
  for (;;) {
    ssize_t r = ::read(sfd, &info, sizeof info);
    if (r == ssize_t(sizeof info)) return int(info.ssi_signo);
    if (r < 0 && errno == EINTR) continue;
    return 0;
  }
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  if (abbrev) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

std::string epoch_realtime() {
  timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%lld.%06ld", (long long)ts.tv_sec, ts.tv_nsec / 1000);
  return buf;
}

std::string local_timestamp(bool millis) {
  timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  std::tm tm{};
  ::localtime_r(&ts.tv_sec, &tm);
  char buf[64];
  size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  if (millis) std::snprintf(buf + n, sizeof buf - n, ".%03ld", ts.tv_nsec / 1000000);
  return buf;
}

double monotonic_s() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

std::string host_name() {
  if (const char* h = std::getenv("HOSTNAME"); h && *h) return h;
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

std::string self_exe() {
  char buf[PATH_MAX + 1] = {};
  ssize_t n = ::readlink("/proc/self/exe", buf, PATH_MAX);
  return n > 0 ? std::string(buf, size_t(n)) : std::string("thetad-launch");
}

bool process_alive(pid_t pid) {
  std::string text;
  if (pid <= 0 || !read_file("/proc/" + std::to_string(pid) + "/stat", text)) return false;
  size_t p = text.rfind(')');
  if (p == std::string::npos || p + 2 >= text.size()) return false;
  char state = text[p + 2];
  return state != 'Z' && state != 'X';
}

std::vector<std::string> process_cmdline(pid_t pid) {
  std::string text;
  std::vector<std::string> out;
  if (!read_file("/proc/" + std::to_string(pid) + "/cmdline", text)) return out;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i)
    if (text[i] == '\0') {
      out.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  return out;
}

std::string absolute_path(const std::string& path, bool must_exist) {
  char buf[PATH_MAX + 1];
  if (::realpath(path.c_str(), buf)) return buf;
  return must_exist ? "" : normalize_path(path);
}

std::string normalize_path(const std::string& path) {
  std::string full = path;
  if (full.empty() || full[0] != '/') {
    char cwd[PATH_MAX + 1];
    full = std::string(::getcwd(cwd, sizeof cwd) ? cwd : ".") + "/" + path;
  }
  std::vector<std::string> parts;
  std::stringstream ss(full);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  std::string out;
  for (auto& p : parts) out += "/" + p;
  return out.empty() ? "/" : out;
}

}  // namespace thetad::launch
