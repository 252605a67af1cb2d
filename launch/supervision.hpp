// The launcher's state machine, free of processes and clocks: signals, the start of
// mpirun/srun, the count of ranks up, mpirun/srun's end and the ranks still running on this host
// come in as calls; what to do comes out as actions that supervisor.cpp carries out. One stop
// signal at any moment is one transition; later ones change nothing.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace thetad::launch {

enum class Phase {
  Preparing,    // checking the job; nothing started yet
  Running,      // mpirun/srun runs
  StopPending,  // a stop came: waiting until every rank's wrapper is up to receive it
  Stopping,     // the stop was sent; waiting for mpirun/srun to end
  Draining,     // mpirun/srun ended during a stop: waiting for this host's ranks to checkpoint
  Done,
};

struct Action {
  enum Kind {
    Log,        // print `text` (one launcher message)
    Launch,     // start mpirun/srun
    StopRanks,  // SIGUSR1 to mpirun/srun, SIGTERM to this host's wrappers
    Exit,       // end now with `code` (cleanup kills what is left)
    Summarize,  // the run is over: report from the exit records; mpirun/srun ended with `code`
  };
  Action(Kind k, std::string t = {}, int c = 0) : kind(k), text(std::move(t)), code(c) {}
  Kind kind;
  std::string text;
  int code = 0;
};
using Actions = std::vector<Action>;

class Supervision {
 public:
  struct Config {
    int ranks = 1;                 // ranks in the job
    int nodes = 1;                 // nodes they run on
    std::string launcher = "mpirun";
    double start_wait_s = 10;      // several nodes: how long a stop waits for wrappers to be up
    double drain_wait_s = 120;     // THETAD_LAUNCH_STOP_WAIT_S
  };
  explicit Supervision(Config c) : cfg_(std::move(c)) {}

  // SIGINT/SIGTERM/SIGHUP stop the job, SIGQUIT kills it; other signals are ignored.
  Actions on_signal(int sig, double now);
  // The job was checked: start mpirun/srun, or end with 4 when a stop came meanwhile.
  Actions on_ready_to_launch(double now);
  // `started` ranks have a wrapper up (or an exit record); polled while wants_rank_count().
  Actions on_ranks_started(int started, double now);
  // mpirun/srun ended with `code` (128+N: signal N).
  Actions on_launcher_exit(int code, double now);
  // `running` wrappers of this host still run; polled while phase() == Draining.
  Actions on_local_ranks(int running, double now);

  Phase phase() const { return phase_; }
  bool stop_requested() const { return stop_sig_ != 0; }
  int stop_signal() const { return stop_sig_; }
  bool wants_rank_count() const { return phase_ == Phase::StopPending; }
  int launcher_code() const { return launcher_code_; }

 private:
  Actions send_stop();
  Actions finish(int code, double now);

  Config cfg_;
  Phase phase_ = Phase::Preparing;
  int stop_sig_ = 0;
  bool told_stopping_ = false;
  bool announced_drain_ = false;
  double deadline_ = 0;
  int launcher_code_ = 0;
};

const char* phase_name(Phase p);

}  // namespace thetad::launch
