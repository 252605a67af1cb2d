// The pipelined stop agreement (see stop_agreement.hpp).
#include "daemon/train/stop_agreement.hpp"

namespace thetad::daemon {

std::atomic<int> g_stop_signal{0};
std::atomic<bool> g_training_started{false};

bool StopAgreement::stop_after(int64_t step) {
  const bool stop = posted_.get();
  if (!stop && step + 1 < total_steps_)
    posted_ = plane_.post_any(g_stop_signal.load() != 0, {"allreduce of the stop flag", step, -1});
  return stop;
}

}  // namespace thetad::daemon
