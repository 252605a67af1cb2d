// The launcher's state machine (see supervision.hpp). Messages are the ones users and the tests
// know from the shell launcher.
#include "launch/supervision.hpp"

#include <csignal>

#include "launch/sys.hpp"

namespace thetad::launch {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Preparing: return "preparing";
    case Phase::Running: return "running";
    case Phase::StopPending: return "stop-pending";
    case Phase::Stopping: return "stopping";
    case Phase::Draining: return "draining";
    case Phase::Done: return "done";
  }
  return "?";
}

Actions Supervision::on_signal(int sig, double now) {
  if (sig == SIGQUIT) {
    if (phase_ == Phase::Done) return {};
    phase_ = Phase::Done;
    return {{Action::Log, "SIGQUIT: killing the job"}, {Action::Exit, "", 1}};
  }
  if (sig != SIGINT && sig != SIGTERM && sig != SIGHUP) return {};
  if (stop_sig_ == 0) {
    stop_sig_ = sig;
    if (phase_ != Phase::Running) return {};  // Preparing: acted on at on_ready_to_launch
    phase_ = Phase::StopPending;
    deadline_ = now + cfg_.start_wait_s;
    return {{Action::Log, signal_name(sig) + ": asking every rank to checkpoint and exit", 0}};
  }
  const bool stopping =
      phase_ == Phase::StopPending || phase_ == Phase::Stopping || phase_ == Phase::Draining;
  if (stopping && !told_stopping_) {  // once: Slurm may send many
    told_stopping_ = true;
    return {{Action::Log, signal_name(sig) +
                              " again: already stopping, the ranks finish their checkpoint "
                              "(SIGQUIT kills the job)"}};
  }
  return {};
}

Actions Supervision::on_ready_to_launch(double) {
  if (phase_ != Phase::Preparing) return {};
  if (stop_sig_ != 0) {
    phase_ = Phase::Done;
    return {{Action::Log, signal_name(stop_sig_) + ": stopped before any rank started"},
            {Action::Exit, "", 4}};
  }
  phase_ = Phase::Running;
  return {{Action::Launch, "", 0}};
}

Actions Supervision::send_stop() {
  phase_ = Phase::Stopping;
  return {{Action::StopRanks, "", 0}};
}

Actions Supervision::on_ranks_started(int started, double now) {
  if (phase_ != Phase::StopPending) return {};
  // mpirun forwards a signal only to ranks it has started, and a wrapper takes it as a stop only
  // once it is up; on several nodes whose wrappers this host may not see, wait a bounded time.
  if (started >= cfg_.ranks || (cfg_.nodes > 1 && now >= deadline_)) return send_stop();
  return {};
}

Actions Supervision::on_launcher_exit(int code, double now) {
  switch (phase_) {
    case Phase::Running:
    case Phase::Stopping:
      return finish(code, now);
    case Phase::StopPending: {  // ended before every wrapper was up: still stop this host's ranks
      Actions a = send_stop();
      Actions f = finish(code, now);
      a.insert(a.end(), f.begin(), f.end());
      return a;
    }
    default:
      return {};
  }
}

Actions Supervision::finish(int code, double now) {
  launcher_code_ = code;
  // srun can end before its tasks (Slurm's requeue signals srun too; the tasks are
  // slurmstepd's): exit 4 must mean the checkpoints are on disk, so wait for this host's ranks.
  if (stop_sig_ != 0 && code > 128) {
    phase_ = Phase::Draining;
    deadline_ = now + cfg_.drain_wait_s;
    return {};
  }
  phase_ = Phase::Done;
  return {{Action::Summarize, "", code}};
}

Actions Supervision::on_local_ranks(int running, double now) {
  if (phase_ != Phase::Draining) return {};
  if (running == 0) {
    phase_ = Phase::Done;
    return {{Action::Summarize, "", launcher_code_}};
  }
  Actions a;
  if (now >= deadline_) {
    phase_ = Phase::Done;
    char secs[32];
    std::snprintf(secs, sizeof secs, "%g", cfg_.drain_wait_s);
    a.push_back({Action::Log, std::string("ranks still running ") + secs + " s after " +
                                  cfg_.launcher + " ended; not waiting longer"});
    a.push_back({Action::Summarize, "", launcher_code_});
    return a;
  }
  if (!announced_drain_) {
    announced_drain_ = true;
    a.push_back({Action::Log, cfg_.launcher + " ended (code " + std::to_string(launcher_code_) +
                                  ") before every rank of this host: waiting for their stop "
                                  "checkpoints"});
  }
  return a;
}

}  // namespace thetad::launch
