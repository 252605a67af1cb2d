// SIGTERM/SIGINT/SIGUSR1 set g_stop_signal; the ranks agree at step ends whether any of them
// was asked to stop, so that all checkpoint the same step and exit 4 together.
#pragma once

#include <atomic>
#include <cstdint>

#include "comm/control_plane.hpp"

namespace thetad::daemon {

// Set by the signal handler (main.cpp); read by StopAgreement.
extern std::atomic<int> g_stop_signal;
// Set when the step loop begins (the StopAgreement is made): before it, a stop that start-up does
// not reach within kStartupStopGraceS ends the process (main.cpp), never waits on a hung open.
extern std::atomic<bool> g_training_started;
constexpr unsigned kStartupStopGraceS = 10;

class StopAgreement {
 public:
  StopAgreement(comm::ControlPlane& plane, int64_t total_steps) : plane_(plane), total_steps_(total_steps) {
    g_training_started.store(true);
  }
  // After step `step`: whether every rank stops now. Pipelined: step s posts this rank's flag
  // and step s+1 reads the result, so no step waits on the control plane for the slowest
  // rank's host. Every rank reads the same results at the same steps, so all stop at the same
  // step (one later than a blocking agreement would). The last step posts nothing: nothing is
  // left in flight when the loop ends.
  bool stop_after(int64_t step);

 private:
  comm::ControlPlane& plane_;
  const int64_t total_steps_;
  comm::ControlPlane::AnyFlag posted_;
};

}  // namespace thetad::daemon
