// The launcher's run: starts mpirun/srun in a session of its own, merges the ranks' output, and
// drives the state machine (supervision.hpp) from one poll loop over its signalfd, mpirun's
// pidfd, mpirun's stderr, the log socket and the wrappers' connections; then reports from the
// exit records and leaves nothing behind.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "launch/log_merge.hpp"
#include "launch/plan.hpp"
#include "launch/spawn.hpp"
#include "launch/supervision.hpp"
#include "launch/sys.hpp"

namespace thetad::launch {

class Supervisor {
 public:
  // `signals`: the signalfd taken at the program's first moment (signals before now wait in it).
  Supervisor(Plan plan, Fd signals);
  // Runs the job to its end; returns the launcher's exit code.
  int run();

 private:
  // A wrapper of this host, connected to the log socket.
  struct Wrapper {
    Fd fd;
    int rank = -1;  // from its first line
    pid_t pid = -1;
    Fd pidfd;
    LineBuffer buf{kMaxMergedLineBytes};
  };

  void perform(const Actions& actions);
  void launch();
  void stop_ranks();
  void accept_wrapper();
  void read_wrapper(size_t i);
  void read_launcher_stderr();
  void emit(const std::string& lines);
  void drain_output(double limit_s);
  int count_started_ranks() const;
  int count_running_wrappers() const;
  std::vector<pid_t> local_wrapper_pids() const;
  int report();
  void cleanup();
  void log(const std::string& msg);

  Plan plan_;
  Fd sfd_;
  Supervision sm_;
  Child launcher_;
  bool launcher_running_ = false;
  Fd launcher_err_;
  LineBuffer launcher_buf_{kMaxMergedLineBytes};
  Fd listen_;
  std::vector<std::unique_ptr<Wrapper>> wrappers_;
  std::vector<int> closed_order_;
  Fd launch_log_;
  bool stop_sent_ = false;
  bool done_ = false;
  int exit_code_ = 0;
  bool summarize_ = false;
};

}  // namespace thetad::launch
