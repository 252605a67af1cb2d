// Shared helpers of offload/ (see util.hpp).
#include "offload/util.hpp"

#include <thread>

#include "common/errors.hpp"

namespace thetad::offload {

void wait_until(const std::function<bool()>& done, double timeout_s,
                const std::function<std::string()>& what, const std::function<void()>& poll) {
  if (done()) return;
  const auto start = std::chrono::steady_clock::now();
  for (int spin = 0;; ++spin) {
    if (done()) return;
    // What we wait for takes milliseconds: spin briefly, then yield, then sleep.
    if (spin < 64) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (poll) poll();
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timeout_s > 0 && waited > timeout_s)
      throw TimeoutError(detail::concat("offload: waited ", waited, " s for ", what()));
  }
}

}  // namespace thetad::offload
