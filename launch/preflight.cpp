// The launcher's checks, interruptible by a stop signal (see preflight.hpp).
#include "launch/preflight.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <exception>
#include <optional>
#include <thread>

#include "launch/spawn.hpp"
#include "launch/supervision.hpp"
#include "launch/sys.hpp"

namespace thetad::launch {

Plan make_plan_interruptible(const Options& o, int signal_fd) {
  Fd done[2];
  make_pipe(done);
  std::optional<Plan> plan;
  std::exception_ptr error;
  // The thread inherits the blocked signal mask: every signal still reaches the signalfd only.
  std::thread check([&] {
    try {
      plan = make_plan(o);
    } catch (...) {
      error = std::current_exception();
    }
    write_all(done[1].get(), "x", 1);
  });
  // The state machine's Preparing phase says what a signal now means; nothing is running yet.
  Supervision sm(Supervision::Config{});
  for (;;) {
    pollfd fds[2] = {{signal_fd, POLLIN, 0}, {done[0].get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) break;
    if (fds[1].revents) break;
    if (!fds[0].revents) continue;
    while (int sig = read_signal(signal_fd)) {
      Actions actions = sm.on_signal(sig, monotonic_s());
      if (sm.stop_requested() && actions.empty()) actions = sm.on_ready_to_launch(monotonic_s());
      for (const auto& a : actions) {
        if (a.kind == Action::Log) write_all(STDERR_FILENO, "thetad-launch: " + a.text + "\n");
        // The check may be blocked in a system call: end without waiting for it. Its helper
        // programs die with this process (program_output.hpp).
        if (a.kind == Action::Exit) std::_Exit(a.code);
      }
    }
  }
  check.join();
  if (error) std::rethrow_exception(error);
  return std::move(*plan);
}

}  // namespace thetad::launch
