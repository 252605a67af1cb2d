// The split of a streamed trunk's optimizer work (offload.shared_split_layers: auto): how many of
// its lowest streamed layers to update on the device (values and Adam moments streamed in and
// out through update lines, update_lines.hpp) rather than by the host's CPU AdamW, so that the
// step's three host-side resources, PCIe each way and the host's memory under the CPU AdamW,
// end together. A model of bytes per parameter, per step:
//
//                   to the device                 back to the host    CPU AdamW (host memory)
//   host layer      2 x value bytes (fwd, bwd)    4 (the gradient)     28 (+2 with bf16 copies)
//   device layer    2 x value bytes + 12 (line)   12 (the line)        0
//
// Each resource's time is its bytes over its measured bandwidth; the split is the count with the
// least longest time (the fewest layers on a tie). Compute is not in it: it overlaps all three.
#pragma once

#include <cstddef>
#include <vector>

#include "offload/device_cache.hpp"

namespace thetad::offload {

struct SplitTimes {
  double h2d_s = 0, d2h_s = 0, cpu_s = 0;
  double longest_s() const;
};

// The times when the lowest `device` of `layers` (parameter counts, lowest layer first) are
// updated on the device.
SplitTimes split_times(const std::vector<size_t>& layers, size_t device, const UpdateBandwidths& bw, bool bf16_copies);
// The balanced count, 0 ... layers.size().
size_t balanced_split(const std::vector<size_t>& layers, const UpdateBandwidths& bw, bool bf16_copies);

}  // namespace thetad::offload
