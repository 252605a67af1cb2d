// Shared by the config tests: runs a piece of work in a child process with a time bound (and, where
// no sanitizer needs its own address space, a memory bound), so that a regression that hangs or
// grows without end fails its test instead of hanging the suite.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <string>

namespace thetad::config::test {

struct BoundedResult {
  bool in_time = false;  // the work returned within the bound (and the child exited normally)
  std::string text;      // what the work returned
};

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kMemoryLimitApplies = false;  // the sanitizers reserve terabytes of address space
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kMemoryLimitApplies = false;
#else
inline constexpr bool kMemoryLimitApplies = true;
#endif
#else
inline constexpr bool kMemoryLimitApplies = true;
#endif

// `work` in a forked child, killed after `limit`; with `memory_bytes` (> 0) its address space is
// limited to that, so that an allocation past it fails there (std::bad_alloc) instead of swapping.
inline BoundedResult run_bounded(const std::function<std::string()>& work, std::chrono::milliseconds limit,
                                 size_t memory_bytes = 0) {
  int fds[2];
  if (::pipe(fds) != 0) return {false, "pipe failed"};
  const pid_t pid = ::fork();
  if (pid < 0) return {false, "fork failed"};
  if (pid == 0) {
    ::close(fds[0]);
    if (memory_bytes > 0 && kMemoryLimitApplies) {
      const rlimit lim{memory_bytes, memory_bytes};
      ::setrlimit(RLIMIT_AS, &lim);
    }
    std::string text;
    try {
      text = work();
    } catch (const std::exception& e) {
      text = std::string("exception: ") + e.what();
    }
    for (size_t off = 0; off < text.size();) {
      const ssize_t n = ::write(fds[1], text.data() + off, text.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  BoundedResult out;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  bool open = true;
  while (open) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[65536];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n > 0)
      out.text.append(buf, static_cast<size_t>(n));
    else
      open = false;  // the child closed its end: done (or dead)
  }
  ::close(fds[0]);
  int status = 0;
  if (open) ::kill(pid, SIGKILL);  // past the bound
  ::waitpid(pid, &status, 0);
  out.in_time = !open && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return out;
}

}  // namespace thetad::config::test
