// Small POSIX helpers of the launcher: an owning fd, whole writes, pidfds, the signal set the
// launcher and its wrappers take through a signalfd, time stamps and /proc reads.
#pragma once

#include <sys/types.h>

#include <csignal>
#include <string>
#include <vector>

namespace thetad::launch {

// A move-only file descriptor, closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release();
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// write(2) until all of `data` is written (EINTR and short writes retried); false on error.
bool write_all(int fd, const char* data, size_t n);
inline bool write_all(int fd, const std::string& s) { return write_all(fd, s.data(), s.size()); }

// The file's text; false when it cannot be read (for /proc; the log dir's files: private_dir.hpp).
bool read_file(const std::string& path, std::string& out);
// Reads `fd` to its end, at most `max` bytes; false on a read error.
bool read_fd(int fd, size_t max, std::string& out);
// `bytes` random bytes from the kernel (getrandom) as lowercase hex; throws Error if none come.
std::string random_hex(size_t bytes);

// pidfd_open(2); an invalid Fd when the process is gone or the kernel lacks pidfds.
Fd pidfd_open(pid_t pid);
// Signals through a pidfd (never a reused pid); falls back to kill(2) when fd is -1.
bool pidfd_signal(int pidfd, pid_t pid, int sig);

// Blocks `sigs` and returns a signalfd that reads them (non-blocking, close-on-exec). A signal
// ignored on entry (a background shell's SIGINT) is set back to a do-nothing handler first: an
// ignored signal is discarded before a signalfd can read it; with `show_caught` the others get
// that handler too, so that /proc/PID/status shows them caught (the handler never runs: they
// stay blocked).
Fd take_signals(const std::vector<int>& sigs, bool show_caught);
// The next signal read from a signalfd, 0 when none is pending.
int read_signal(int sfd);

// "SIGTERM" for SIGTERM; "signal N" for unnamed ones.
std::string signal_name(int sig);
// Seconds since the epoch with microseconds ("1732540000.123456"), as bash's EPOCHREALTIME.
std::string epoch_realtime();
// "[2026-01-02 03:04:05.678] " style local time with milliseconds, for log headers.
std::string local_timestamp(bool millis);
double monotonic_s();
std::string host_name();
// The executable's absolute path (/proc/self/exe).
std::string self_exe();
// Whether PID exists and has not ended (a zombie has ended).
bool process_alive(pid_t pid);
// The NUL-separated command line of PID, split; empty when unreadable.
std::vector<std::string> process_cmdline(pid_t pid);
// realpath(3) of an existing path; normalize_path's when it does not.
std::string absolute_path(const std::string& path, bool must_exist);
// Absolute and normalized by its text alone (no ".", "..", or repeated '/'), links not resolved.
std::string normalize_path(const std::string& path);

}  // namespace thetad::launch
