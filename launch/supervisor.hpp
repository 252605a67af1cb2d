// The launcher's run: starts mpirun/srun in a session of its own, merges the ranks' output, and
// drives the state machine (supervision.hpp) from one poll loop over its signalfd, mpirun's
// pidfd, mpirun's stderr and the wrappers' connections (wrapper_links.hpp); then reports from the
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
#include "launch/wrapper_links.hpp"

namespace thetad::launch {

class Supervisor {
 public:
  // `signals`: the signalfd taken at the program's first moment (signals before now wait in it).
  Supervisor(Plan plan, Fd signals);
  // Runs the job to its end; returns the launcher's exit code.
  int run();

 private:
  void perform(const Actions& actions);
  void launch();
  void stop_ranks();
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
  WrapperLinks links_;
  Fd dir_;  // the log dir, every file in it opened relative to it
  Fd launch_log_;
  bool done_ = false;
  int exit_code_ = 0;
  bool summarize_ = false;
};

}  // namespace thetad::launch
