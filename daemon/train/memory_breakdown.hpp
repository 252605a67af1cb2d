// A step's device memory by what holds it (GPUs; zeros on the CPU): the homes' parameters, Adam
// moments and lines, the engine's gradient buffers, and the caching allocator's peak over the
// step, of which what the step added beyond new moments is its activations and workspace. The
// parts sum to the step's peak (mem_step_peak_bytes) by construction; mem_other_bytes is what
// the allocator held at the step's start that no home accounts for (the data, caches of
// LibTorch), so a large value points at memory nobody meant to keep.
#pragma once

#include <algorithm>
#include <cstdint>

#include "daemon/observe/metrics.hpp"
#include "daemon/device/data_plane.hpp"
#include "daemon/homes/group_home.hpp"

namespace thetad::daemon {

class MemoryBreakdown {
 public:
  explicit MemoryBreakdown(const DataPlane& plane) : plane_(plane) {}

  // Before the step's first allocation: the allocator's peak starts at what it holds now.
  void start_step(const HomeMemory& homes) {
    if (!plane_.gpu()) return;
    start_ = plane_.allocator_current_bytes();
    start_optimizer_ = homes.optimizer;
    plane_.reset_allocator_peak();
  }

  // Once the step's work is queued (the host allocates as it queues). `grad_bytes`: the engine's
  // gradient buffers (outside the allocator); `adopted_grad_bytes`: gradients autograd made and
  // the engine adopted (a world of one), inside the allocator's peak: counted as gradients up to
  // what the step added, the rest of which is activations and workspace.
  void record(const HomeMemory& homes, int64_t grad_bytes, int64_t adopted_grad_bytes, StepRecord& rec) {
    if (!plane_.gpu()) return;
    const int64_t step_peak = plane_.allocator_peak_bytes();
    const int64_t added = step_peak - start_ - (homes.optimizer - start_optimizer_);
    const int64_t adopted = std::max<int64_t>(0, std::min(adopted_grad_bytes, added));
    rec.mem_params_bytes = homes.params;
    rec.mem_grads_bytes = grad_bytes + adopted;
    rec.mem_optimizer_bytes = homes.optimizer;
    rec.mem_lines_bytes = homes.lines;
    rec.mem_activations_bytes = added - adopted;
    rec.mem_other_bytes = start_ - homes.params - start_optimizer_;
    rec.mem_step_peak_bytes = step_peak + grad_bytes + homes.lines;
    peak_ = std::max(peak_, rec.mem_step_peak_bytes);
    rec.device_mem_peak_bytes = peak_;
  }

 private:
  const DataPlane& plane_;
  int64_t start_ = 0, start_optimizer_ = 0, peak_ = 0;
};

}  // namespace thetad::daemon
