// Small helpers shared by offload/: byte counts in MiB for messages, and the wait that polls a
// condition with backoff under a timeout.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace thetad::offload {

inline double mib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// StoreOptions::timeout_s as the control plane's timeout; <= 0 (no timeout) as a year.
inline std::chrono::milliseconds timeout_of(double seconds) {
  if (!(seconds > 0)) return std::chrono::hours(24 * 365);
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0 + 0.5));
}

// Waits until done() is true: spins briefly, then yields, then sleeps, to leave the cores to the
// threads doing the work. `poll` (if any) runs between sleeps and may throw (ending the wait
// with its error). After timeout_s (> 0) throws TimeoutError "offload: waited <s> s for
// <what()>" (what() is evaluated only then, so it can report the state at the timeout).
void wait_until(const std::function<bool()>& done, double timeout_s,
                const std::function<std::string()>& what, const std::function<void()>& poll = {});

}  // namespace thetad::offload
