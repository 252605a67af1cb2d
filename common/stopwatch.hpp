// Wall time in milliseconds since a steady-clock point: the phase timings of the step loop and
// of checkpoints (metrics and log lines).
#pragma once

#include <chrono>

namespace thetad {

using SteadyClock = std::chrono::steady_clock;

inline double ms_since(SteadyClock::time_point t0) {
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - t0).count();
}

}  // namespace thetad
