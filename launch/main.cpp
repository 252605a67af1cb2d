// thetad-launch: starts one `thetad run` per GPU under mpirun (or srun inside a Slurm
// allocation) after checking the job with thetad's own loader; see docs/deploy.md. The same
// program is each rank's wrapper (`--worker`, worker.hpp).
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "common/errors.hpp"
#include "common/text.hpp"
#include "launch/options.hpp"
#include "launch/plan.hpp"
#include "launch/preflight.hpp"
#include "launch/supervisor.hpp"
#include "launch/sys.hpp"
#include "launch/worker.hpp"

namespace {

int launcher_main(int argc, char** argv) {
  using namespace thetad::launch;
  // From the first moment a stop is kept (blocked, read from the signalfd) and acted on once
  // there is something to stop; it neither kills the launcher nor gets lost.
  Fd sfd = take_signals({SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGCHLD}, true);
  Options o;
  try {
    o = parse_options(argc, argv);
  } catch (const thetad::ConfigError& e) {
    if (*e.what() == '\0') {  // no JOB.yaml
      std::fputs(usage_text(), stderr);
      return thetad::kExitBadInput;
    }
    throw;
  }
  if (o.help) {
    std::fputs(usage_text(), stdout);
    return thetad::kExitOk;
  }
  Plan plan = make_plan_interruptible(o, sfd.get());
  if (o.dry_run) {
    std::cout << "validate: in-process, as " << shell_words(plan.validate_note) << "\n"
              << "launch: " << shell_words(plan.command) << "\n"
              << "ranks: " << plan.ranks << " (" << plan.nodes << " node(s) x " << plan.nproc
              << "), gpus visible here: " << plan.gpus << ", log dir: " << plan.log_dir << "\n";
    return thetad::kExitOk;
  }
  return Supervisor(std::move(plan), std::move(sfd)).run();
}

}  // namespace

int main(int argc, char** argv) {
  const bool worker = argc > 1 && std::strcmp(argv[1], "--worker") == 0;
  try {
    if (argc > 1 && std::strcmp(argv[1], "--exec-child") == 0)
      return thetad::launch::exec_child_main(argc, argv);
    if (worker) return thetad::launch::worker_main(argc, argv);
    return launcher_main(argc, argv);
  } catch (const std::exception& e) {
    // A path in a message may hold any byte: written out, never sent to the terminal raw.
    std::fprintf(stderr, "thetad-launch: error: %s\n", thetad::printable(e.what()).c_str());
    return thetad::exit_code_for(e);
  }
}
