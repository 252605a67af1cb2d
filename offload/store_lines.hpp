// The parameter store's device cache (ParamStore::cache()): lines of device memory, each holding
// one whole group with its Adam state (params, m, v), placed per step by DeviceCachePolicy over
// every rank's schedule; some of them may be transit lines, through which a group the cache does
// not keep is streamed for one step. A group in a line is updated on the device by the caller's
// AdamW, on the line's memory, and goes back to the host arena only when it leaves the line.
//
//   if (store.cache().cached(g)) adamw(store.cache().cached_params(g), ..._exp_avg(g), ..._exp_avg_sq(g));
//
// The store drives it (place, prefetch, read, drop: "the store's side" below); callers use the
// queries and order_state()/size_cache().
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "offload/device_cache.hpp"
#include "offload/store_core.hpp"

namespace thetad::offload {

class CacheLines {
 public:
  // Every rank's groups at a step (null: no cache, whatever cache_bytes says).
  using Schedule = std::function<std::vector<int>(int64_t step)>;

  // Allocates the lines core.opts.cache_bytes gives (collective over the job's ranks).
  CacheLines(StoreCore& core, Schedule groups_used_at);
  // Waits for the copies in and out of the lines, then frees them.
  ~CacheLines();
  CacheLines(const CacheLines&) = delete;
  CacheLines& operator=(const CacheLines&) = delete;

  // The lines (0 = none), and the device bytes of one: 3 x the largest group that is not
  // row-sharded (0: no such group).
  int64_t cache_lines() const { return policy_.lines(); }
  size_t cache_line_bytes() const { return 3 * line_numel_ * sizeof(float); }
  // In a line: cached, or streamed through a transit line for this step (updated alike).
  bool cached(int group) const { return policy_.cached(core_.index_of(group)); }
  bool in_transit(int group) const { return policy_.in_transit(core_.index_of(group)); }
  int64_t transit_lines() const { return policy_.transit_lines(); }
  // The group's line: its values, m and v (device memory; InternalError when not in a line).
  float* cached_params(int group) { return line_part(group, 0); }
  float* cached_exp_avg(int group) { return line_part(group, 1); }
  float* cached_exp_avg_sq(int group) { return line_part(group, 2); }
  // Before the step's first device update of a line's group (e.g. before backward): the compute
  // stream waits for the Adam state of the groups place() streamed into transit lines (their
  // values it already waited for; m and v crossed meanwhile, overlapping forward).
  void order_state();
  // Collective, between steps, on a store built with no cache (cache_bytes 0): gives it one of
  // `bytes` (offload.device_cache_mb: auto sizes it after the first step, once the allocator
  // holds that step's activations). Groups enter it from the next place() on.
  void size_cache(size_t bytes);

  // The store's side.
  const DeviceCachePolicy& policy() const { return policy_; }
  // ParamStore::place after its step began: the evictions, loads and streamed groups of `step`.
  void place(int64_t step);
  // ParamStore::prefetch_for: the next step's groups into free lines (not used at `step`).
  void prefetch(int64_t step);
  // A new step began: forgets the schedule of the steps before it.
  void forget_before(int64_t step);
  // Copies the line of a group in a line out to host memory (null pointers are skipped), after
  // the compute queued so far.
  void read(size_t gi, float* params, float* exp_avg, float* exp_avg_sq);
  // Resume is about to overwrite the group's values in the arena: it leaves its line.
  void drop(size_t gi);
  // For the log, at construction and when sized ("" or a note on when).
  void log(const char* when) const;

 private:
  // What the compute stream waits for of a line's load: all of it now, its values now and its
  // Adam state at order_state(), or nothing before the next place() (a load for the next step).
  enum class LineWait { now, values_now, next_step };
  void alloc();
  float* line_part(int group, int part);
  void load_line(size_t gi, int line, LineWait wait = LineWait::now);
  void load_state(size_t gi, int line);
  void wait_early_load(int line);
  void flush_line(size_t gi, int line);
  UpdateBandwidths measure_bandwidths();
  const std::vector<size_t>& used_at(int64_t step);

  StoreCore& core_;
  Schedule used_schedule_;
  DeviceCachePolicy policy_{0, {}};
  size_t line_numel_ = 0;                 // floats per part (params, m, v) of a line
  std::vector<void*> line_mem_;           // per line: 3 x line_numel_ floats
  std::vector<Fence> line_free_;          // per line: its last copy out
  std::vector<Fence> line_loaded_;        // per line: a load for the next step, not yet waited on by compute
  std::vector<Fence> state_loaded_;       // per line: Adam state streamed in, not yet waited on by compute
  std::map<int64_t, std::vector<size_t>> used_cache_;  // step -> entries any rank uses
};

}  // namespace thetad::offload
