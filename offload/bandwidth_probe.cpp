// The bandwidths offload.uncached_update: auto weighs (see bandwidth_probe.hpp).
#include "offload/bandwidth_probe.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <vector>

#include "offload/cpu_adam.hpp"

namespace thetad::offload {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The best of three rounds: the first may wait behind copies the step queued before it.
template <typename Round>
double best_rate(double bytes_per_round, Round round) {
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    round();
    best = std::max(best, bytes_per_round / std::max(seconds_since(t0), 1e-9));
  }
  return best;
}

}  // namespace

UpdateBandwidths probe_bandwidths(Device& device, void* device_buf, size_t numel) {
  constexpr size_t kCopyBytes = size_t{64} << 20;     // per direction and round
  constexpr size_t kAdamParams = size_t{16} << 20;    // per round
  const size_t part = std::max<size_t>(1, std::min(numel, kCopyBytes / sizeof(float))) * sizeof(float);
  const size_t copies = std::clamp<size_t>(kCopyBytes / part, 1, 256);  // small groups: per-copy cost counts

  UpdateBandwidths bw;
  {
    constexpr size_t kPage = 4096;
    const size_t alloc = (part + kPage - 1) / kPage * kPage;
    std::unique_ptr<void, decltype(&std::free)> host(std::aligned_alloc(kPage, alloc), &std::free);
    std::fill_n(static_cast<char*>(host.get()), alloc, char{0});
    device.pin_host(host.get(), alloc);
    const auto round = [&](bool to_device) {
      Fence last;
      for (size_t c = 0; c < copies; ++c)
        last = to_device ? device.h2d(device_buf, host.get(), part, Fence{})
                         : device.d2h(host.get(), device_buf, part, Fence{});
      device.host_wait(last);
    };
    bw.h2d = best_rate(double(part * copies), [&] { round(true); });
    bw.d2h = best_rate(double(part * copies), [&] { round(false); });
    device.unpin_host(host.get());
  }
  // AdamW over one group's size (at most 4 M parameters), call after call on fresh memory: 16 M
  // parameters (256 MiB of p, g, m, v), more than a CPU's last-level cache, as the store's groups
  // are (an H100 host measured 330 GB/s over one cached 4 M slice, 3.2x the
  // 104 GB/s its steps then ran at). Gradients of a typical size (no subnormal moments).
  const size_t n = std::max<size_t>(1, std::min(numel, kAdamParams / 4));
  const size_t calls = std::clamp<size_t>(kAdamParams / n, 1, 4096);
  std::vector<float> p(n * calls, 0.5f), g(n * calls, 1e-3f), m(n * calls, 0.f), v(n * calls, 0.f);
  AdamHyper h;
  bw.cpu_adam = best_rate(28.0 * double(n * calls), [&] {
    h.step += 1;
    for (size_t c = 0; c < calls; ++c)
      adam_step(p.data() + c * n, g.data() + c * n, m.data() + c * n, v.data() + c * n, n, h);
  });
  return bw;
}

}  // namespace thetad::offload
