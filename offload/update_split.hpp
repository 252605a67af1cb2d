// The split of a streamed trunk's optimizer work (offload.shared_split_layers: auto): how many of
// its lowest streamed layers to update on the device (values and Adam moments streamed in and
// out through update lines, update_lines.hpp) rather than by the host's CPU AdamW. Bytes per
// parameter, per step:
//
//                   to the device                 back to the host    CPU AdamW (host memory)
//   host layer      2 x value bytes (fwd, bwd)    4 (the gradient)     28 (+2 with bf16 copies)
//   device layer    2 x value bytes + 12 (line)   12 (the line)        0
//
// The three host resources do not simply overlap each other and compute: backward hands over the
// top layer's gradient first and layer 0's last, so the CPU updates layer 0 last while the next
// forward needs it first, and each forward acquire waits for its layer's update. model_step
// therefore replays one step as the streamed trunk runs it (a small discrete-event simulation of
// the compute, H2D and D2H streams, the host thread and the CPU AdamW worker, repeated until the
// step is steady) and fastest_split picks the count with the shortest modelled step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "offload/device_cache.hpp"

namespace thetad::offload {

// The resources' plain totals (bytes over bandwidth, no ordering): logged beside the model.
struct SplitTimes {
  double h2d_s = 0, d2h_s = 0, cpu_s = 0;
  double longest_s() const;
};

// The totals when the lowest `device` of `layers` (parameter counts, lowest layer first) are
// updated on the device.
SplitTimes split_times(const std::vector<size_t>& layers, size_t device, const UpdateBandwidths& bw, bool bf16_copies);

// One streamed layer: its parameters, its compute on the device (forward, backward; a layer
// forwarded several times per step counts them all) and the activations it offloads after its
// forward and brings back in backward (0: kept on the device).
struct LayerCost {
  size_t numel = 0;
  double fwd_s = 0, bwd_s = 0;
  double act_bytes = 0;
};

struct StepInput {
  std::vector<LayerCost> layers;  // the streamed layers, lowest first
  UpdateBandwidths bw;
  int64_t prefetch = 1;           // offload.shared_prefetch_layers: device slots and update lines are prefetch + 2
  bool bf16_copies = false;       // offload.h2d_dtype: bf16 (values cross as bf16; the CPU AdamW writes 2 B more)
  double device_adam_bps = 0;     // the device AdamW's memory bandwidth (28 B per parameter); 0: free
  // Compute outside the streamed layers: before the lowest one's forward (layers kept on the
  // device) and after its backward (their backward and update, the rest of the step).
  double before_s = 0, after_s = 0;
  // The lowest streamed layer is the trunk's first: its input needs no gradient, so its backward
  // reads no values (they are still prefetched).
  bool lowest_is_first = true;
};

// The steady step and each resource's busy time in it.
struct StepModel {
  double step_s = 0;
  double compute_s = 0, h2d_s = 0, d2h_s = 0, cpu_s = 0;
};

// The step when the lowest `split` streamed layers are updated through update lines.
StepModel model_step(const StepInput& in, size_t split);
// The least gain over no split (a fraction of its step) for which fastest_split splits.
constexpr double kSplitMargin = 0.25;
// The count 0 ... layers with the shortest modelled step (the fewest within 1% of it: fewer lines
// move fewer bytes for the same time), or 0 where that step is not kSplitMargin shorter than
// none's; `models`, if given, gets every count's model.
size_t fastest_split(const StepInput& in, std::vector<StepModel>* models = nullptr);

}  // namespace thetad::offload
