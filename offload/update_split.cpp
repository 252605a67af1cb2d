// The balanced split of a streamed trunk's optimizer work (see update_split.hpp).
#include "offload/update_split.hpp"

#include <algorithm>

namespace thetad::offload {

double SplitTimes::longest_s() const { return std::max({h2d_s, d2h_s, cpu_s}); }

SplitTimes split_times(const std::vector<size_t>& layers, size_t device, const UpdateBandwidths& bw, bool bf16_copies) {
  const double value_bytes = bf16_copies ? 2 : 4, adam_bytes = bf16_copies ? 30 : 28;
  double h2d = 0, d2h = 0, cpu = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    const double n = static_cast<double>(layers[l]);
    h2d += 2 * value_bytes * n;
    if (l < device) {
      h2d += 12 * n;
      d2h += 12 * n;
    } else {
      d2h += 4 * n;
      cpu += adam_bytes * n;
    }
  }
  const auto time = [](double bytes, double rate) { return rate > 0 ? bytes / rate : (bytes > 0 ? 1e30 : 0.0); };
  return {time(h2d, bw.h2d), time(d2h, bw.d2h), time(cpu, bw.cpu_adam)};
}

size_t balanced_split(const std::vector<size_t>& layers, const UpdateBandwidths& bw, bool bf16_copies) {
  size_t best = 0;
  double best_s = split_times(layers, 0, bw, bf16_copies).longest_s();
  for (size_t k = 1; k <= layers.size(); ++k) {
    const double s = split_times(layers, k, bw, bf16_copies).longest_s();
    if (s < best_s) best = k, best_s = s;
  }
  return best;
}

}  // namespace thetad::offload
