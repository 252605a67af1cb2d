// The store's update lines (StoreOptions::update_lines): a small ring of device lines through
// which a group that lives on the host is updated on the device in the middle of a step, its
// values and Adam state streamed in (12 B per parameter), stepped by the caller's device AdamW
// and streamed back out (12 B), instead of its gradient going to the host (4 B) for the owner's
// CPU AdamW (28 B of host memory traffic). The streamed trunk's split (offload.shared_split_layers)
// sends its lowest streamed layers this way, so that the host's CPU and the PCIe link finish
// together. A line is reused once its copy out has landed: the device orders that, not the host.
//
//   float* line = lines.load(gi);            // compute waits for the values, m and v
//   adamw(line, line + n, line + 2 * n, grad);  // on the compute stream
//   lines.flush(gi);                          // after expected[gi] counted the update
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "offload/store_core.hpp"

namespace thetad::offload {

class UpdateLines {
 public:
  // `lines` lines of 3 x `line_numel` floats; ConfigError naming the bytes where the device
  // refuses them.
  UpdateLines(StoreCore& core, int64_t lines, size_t line_numel);
  // Waits for the copies in and out of the lines, then frees them.
  ~UpdateLines();
  UpdateLines(const UpdateLines&) = delete;
  UpdateLines& operator=(const UpdateLines&) = delete;

  int64_t lines() const { return static_cast<int64_t>(mem_.size()); }
  size_t line_numel() const { return line_numel_; }
  size_t bytes() const { return mem_.size() * 3 * line_numel_ * sizeof(float); }
  // A free line for entry gi's values, m and v once its last update landed (after the line's last
  // copy out, on the H2D stream). The same line while gi holds one (a second call loads nothing).
  // `order_compute` false: a prefetch, the copies overlap the compute queued meanwhile, and
  // order(gi) must come before compute that reads the line.
  float* load(size_t gi, bool order_compute = true);
  void order(size_t gi);
  bool holds(size_t gi) const { return line_of_.count(gi) != 0; }
  // Lines no group holds (a prefetch leaves one for the group being updated).
  int64_t free_lines() const { return lines() - static_cast<int64_t>(line_of_.size()); }
  // After the caller's device update of gi's line (queued on the compute stream) and the count of
  // that update in core.expected: the owner copies the line back to the arena; the line is free
  // for the next load once that has landed.
  void flush(size_t gi);
  // Any line that was loaded and not updated (a step that did not update its group) is let go.
  void release_all();
  // A free line's memory (nothing reads or writes it meanwhile), for probing the bandwidths.
  void* scratch() const { return mem_.front(); }

 private:
  StoreCore& core_;
  size_t line_numel_ = 0;
  std::vector<void*> mem_;
  std::vector<Fence> free_;     // per line: its last copy out (or last compute reading it)
  std::vector<Fence> loaded_;   // per line: a prefetch's copies in, not yet waited on by compute
  std::map<size_t, int> line_of_;  // entry -> its line, while loaded
  int next_ = 0;                // the ring's next line
};

}  // namespace thetad::offload
