// The engine's gradient memory, per bucket, in the mode of its group (GradMemory): owned buffers
// and their zeroing, the pool of group-sized buffers bound per window, and the caller's memory of
// streamed buckets (or scratch) held until their work has completed. Not thread-safe: the engine
// calls it with its lock held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/bucket_plan.hpp"
#include "comm/communicator.hpp"
#include "comm/engine.hpp"

namespace thetad::comm::engine_detail {

class GradBuffers {
 public:
  // Checks opts.grad_memory against the plan (InternalError) and allocates the owned buffers.
  GradBuffers(Communicator& comm, const BucketPlan& plan, const EngineOptions& opts, StepStats& stats);

  GradMemory mode(int group) const {
    return opts_.grad_memory.empty() ? GradMemory::owned : opts_.grad_memory[static_cast<size_t>(group)];
  }
  bool streamed(int group) const { return mode(group) == GradMemory::streamed; }
  bool adopted(int group) const { return mode(group) == GradMemory::adopted; }

  // Bucket b's memory this window: its owned buffer, its slice of its group's pool buffer (bound
  // and zeroed now if needed), or the streamed gradient handed over (else zeroed scratch).
  float* bucket_ptr(int b);
  // Bytes held now: owned buffers and the pool (not streamed memory, which is the caller's).
  size_t bytes() const;

  // Window start: zeroes the buckets written since their last zeroing (not overwrite groups:
  // see zero_unwritten), unbinds the pool, drops every streamed buffer.
  void start_window();
  // Bucket b's memory was written (a gradient arrived, or its reduction).
  void mark_written(int b) { dirty_[static_cast<size_t>(b)] = 1; }
  // Overwrite groups: before bucket b is reduced, zeroes what no gradient overwrote this window
  // (runs of parameters not `seen`), unless the buffer is already zero.
  void zero_unwritten(int b, const std::vector<uint8_t>& seen);

  // Adopted groups: the caller's gradient of `param` at `data` this window.
  void adopt(int param, float* data);
  // Adopted groups: param's gradient, or nullptr (zeros_if_none: zeroed engine memory, held for
  // the window, becomes its gradient).
  float* adopted_grad(int param, bool zeros_if_none);
  size_t adopted_bytes() const { return adopted_bytes_; }

  // Streamed bucket b: the caller's gradient at `data`, owned by `keep`.
  void hand_over(int b, float* data, std::shared_ptr<void> keep);
  bool handed_over(int b) const { return ext_[static_cast<size_t>(b)] != nullptr; }
  // Streamed bucket b was launched as `work`: its memory is held until the work completes.
  // Returns that memory's owner (for the bucket's Launched).
  std::shared_ptr<void> hold_until_done(int b, WorkPtr work);
  // Drops the owners of streamed buffers whose bucket's work has completed (all: `all`).
  void release_held(bool all);

 private:
  float* scratch(int b);
  float* group_base(int g);
  void hold_bytes(int64_t bytes);
  size_t bucket_bytes(int b) const { return plan_.buckets[static_cast<size_t>(b)].numel * sizeof(float); }

  Communicator& comm_;
  const BucketPlan& plan_;
  const EngineOptions& opts_;
  StepStats& stats_;

  std::vector<std::shared_ptr<void>> buffers_;  // one per bucket (null unless owned/overwrite)
  std::vector<uint8_t> dirty_;                  // per bucket: written since its last zeroing
  std::vector<uint8_t> stale_;                  // per bucket (overwrite groups): dirty at window start
  // Pooled groups: group-sized buffers bound per window.
  std::vector<size_t> bucket_offset_;           // per bucket: element offset inside its group
  size_t pool_elems_ = 0;                       // size of a pool buffer: the largest pooled group
  std::vector<std::shared_ptr<void>> pool_;
  std::vector<int> free_slots_;
  std::vector<int> slot_of_group_;              // per group: bound pool buffer or -1
  // Streamed groups: per bucket, the buffer handed over (or scratch) this window and its owner;
  // then, once launched, the owners held until their bucket's work completes.
  std::vector<float*> ext_;
  std::vector<std::shared_ptr<void>> ext_keep_;
  struct Held {
    WorkPtr work;
    size_t bytes;
    std::shared_ptr<void> keep;
  };
  std::vector<Held> held_;
  int64_t held_bytes_ = 0;
  // Adopted groups: per parameter, its gradient this window; the params adopted (to clear them);
  // zeros given to parameters without one.
  std::vector<float*> adopted_;
  std::vector<int> adopted_now_;
  size_t adopted_bytes_ = 0;
  std::vector<std::shared_ptr<void>> adopted_zeros_;
};

}  // namespace thetad::comm::engine_detail
