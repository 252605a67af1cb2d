// The launcher's checks before anything starts (the plan: the job with thetad's loader, the
// hostfile, the programs, the GPUs, the log dir) run on a thread of their own while the main
// thread reads the signalfd, so that a stop signal during a slow or stuck check (a job on a hung
// file system, an nvidia-smi that does not answer) ends the launcher at once: exit 4, nothing
// started. SIGQUIT ends it with 1.
#pragma once

#include "launch/options.hpp"
#include "launch/plan.hpp"

namespace thetad::launch {

// make_plan(o) on a thread; `signal_fd` is the signalfd the program took at its first moment.
// Returns the plan or rethrows the check's error; never returns after a stop signal.
Plan make_plan_interruptible(const Options& o, int signal_fd);

}  // namespace thetad::launch
