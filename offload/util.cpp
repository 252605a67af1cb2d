// Shared helpers of offload/ (see util.hpp).
#include "offload/util.hpp"


#include "common/errors.hpp"
#include "common/poll.hpp"

namespace thetad::offload {

void wait_until(const std::function<bool()>& done, double timeout_s,
                const std::function<std::string()>& what, const std::function<void()>& poll) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = timeout_s > 0 ? start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                     std::chrono::duration<double>(timeout_s))
                                      : std::chrono::steady_clock::time_point::max();
  if (poll_until(done, deadline, std::chrono::microseconds(50), [&] {
        if (poll) poll();
      }))
    return;
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  throw TimeoutError(detail::concat("offload: waited ", waited, " s for ", what()));
}

}  // namespace thetad::offload
