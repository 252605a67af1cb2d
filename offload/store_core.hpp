// What the parameter store's two device paths share (param_store.hpp: slots; store_lines.hpp:
// the device cache's lines): the options, the plan, the host arena with the owner's update
// queue, each group's update count, the copies between the device and the arena, and the stats.
// Built first and destroyed last by ParamStore; nothing outside offload/ uses it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/control_plane.hpp"
#include "offload/cpu_adam.hpp"
#include "offload/device.hpp"
#include "offload/device_cache.hpp"
#include "offload/host_arena.hpp"
#include "offload/store_plan.hpp"
#include "offload/update_queue.hpp"

namespace thetad::offload {

struct StoreOptions {
  static constexpr double kDefaultTimeoutS = std::chrono::duration<double>(comm::kDefaultTimeout).count();

  int64_t device_slots = 4;        // slots of the device cache (used when the budget is 0)
  size_t device_budget_bytes = 0;  // > 0: as many slots of the largest unit as fit in this
  int64_t prefetch = 1;            // steps of lookahead for prefetch_for (0 = no prefetch)
  size_t shard_bytes = 0;          // > 0: groups larger than this split into row shards
  size_t host_limit_bytes = 0;     // > 0: refuse a host arena larger than this
  bool async_step = true;          // owner's CPU Adam on a worker thread, overlapping forward
  // Queued updates whose gradients have landed run lowest group first (not in submission
  // order): for groups that the next forward needs in group order (the streamed trunk's layers,
  // whose gradients arrive last layer first).
  bool lowest_group_first = false;
  int64_t cpu_threads = 0;         // CPU Adam threads (0: the rank's CPU share, cpu_share, less one)
  // Every blocking wait of the store and its arena: another rank's update, this rank's queued
  // steps, the host's and the job's agreements and barriers (TimeoutError naming what it waited for).
  double timeout_s = kDefaultTimeoutS;
  // > 0: device memory for the write-back cache of whole groups with their Adam state (lines
  // of 3 x the largest unsharded group; the ranks use the fewest lines any of them can have).
  size_t cache_bytes = 0;
  // Parameters cross to the device as bfloat16 (acquire and prefetch: half the H2D bytes) and
  // are widened there into the fp32 slot, so the device holds the master's bf16 rounding: what a
  // bf16 job's autocast matmuls read anyway. The arena keeps the fp32 master and a bf16 copy that
  // the owner's CPU AdamW writes in the same pass. The device cache's lines load fp32 (params,
  // m, v): they are the master while the group is cached.
  bool bf16_copies = false;
  // Where a group the device cache does not keep is updated (offload.uncached_update): with
  // Device or Auto, and lines for fewer groups than the arena holds, up to half the lines (no
  // more than any step uses) become transit lines, through which such a group's values and Adam
  // state are streamed for a step and updated by the caller's device AdamW, as a cached group's.
  UncachedUpdate uncached_update = UncachedUpdate::Host;
  // Lines of 3 x the largest group for groups updated on the device within a step, their Adam
  // state streamed in and back out (update_lines.hpp; the streamed trunk's split). 0: none.
  int64_t update_lines = 0;
};

struct StoreStats {
  uint64_t h2d_bytes = 0;
  uint64_t d2h_bytes = 0;
  uint64_t swap_hits = 0;      // acquire found an up-to-date copy (prefetched or kept)
  uint64_t swap_misses = 0;    // acquire had to copy
  uint64_t evictions = 0;
  uint64_t prefetches = 0;     // units copied ahead of use
  uint64_t host_pinned_bytes = 0;
  uint64_t device_slot_bytes = 0;
  double cpu_adam_ms = 0.0;    // time this rank spent in CPU Adam (owner steps)
  double acquire_wait_ms = 0.0;  // time acquire() blocked on a group's pending CPU update
  uint64_t optimizer_steps = 0;  // group steps this rank ran as owner
  uint64_t cache_loads = 0;      // groups brought into the device cache (params, m, v)
  uint64_t cache_flushes = 0;    // groups evicted from it (this rank copied them to the host)
  uint64_t device_steps = 0;     // group updates run on the device (cached groups)
  uint64_t streamed_steps = 0;   // of those, groups streamed through a transit line
  uint64_t cache_line_bytes = 0; // device memory of the cache lines
};

struct StoreCore {
  // Plans the units (ConfigError for bad settings), then, collective over the job's ranks, opens
  // their control plane and the node's shared memory, and builds the arena and the owner's update
  // queue.
  StoreCore(const StoreOptions& options, const std::vector<GroupShape>& groups, Device& dev);
  StoreCore(const StoreCore&) = delete;
  StoreCore& operator=(const StoreCore&) = delete;

  size_t index_of(int group) const { return plan.index.entry_of(group); }
  // index_of, and an InternalError for a group the arena does not hold.
  size_t held_index(int group) const;
  // The owner's update of the entry (maybe on another rank, maybe on our worker) has landed;
  // the time blocked counts as acquire_wait_ms.
  void wait_final(size_t gi);
  // One copy between the device and the arena, split where the arena's pinned chunks end (a copy
  // across a chunk boundary would not count as pinned). Returns the last part's completion.
  Fence copy_split(bool to_device, char* dst, const char* src, size_t bytes, const Fence& after);
  // A line: device memory holding a group's values, m and v, `line_numel` floats apart (the
  // device cache's lines, the streamed trunk's update lines).
  // Copies part `part` (0 values, 1 m, 2 v) of entry gi from the arena into the line, after
  // `after`; counts the bytes.
  Fence load_part(size_t gi, char* line, size_t line_numel, int part, const Fence& after);
  // The line back to the arena: the owner copies values, m and v after `after` (the line's last
  // device update) and publishes update expected[gi] once they landed (the host's other ranks
  // wait for that as for a CPU update). Returns the last copy's completion (`after` elsewhere).
  Fence flush_line(size_t gi, const char* line, size_t line_numel, const Fence& after);
  // The PCIe and CPU AdamW bandwidths (probe_bandwidths on `device_buf`, a free line of at least
  // `numel` floats), the lowest of each over the job's ranks so that all decide alike. Collective.
  UpdateBandwidths agreed_bandwidths(void* device_buf, size_t numel, const char* what);
  // Adds to the stats under their lock (the update queue's thread reads them too).
  template <typename F>
  void count(F&& f) {
    std::lock_guard<std::mutex> lk(stats_mu);
    f(stats);
  }

  StoreOptions opts;
  Device& device;
  StorePlan plan;
  std::vector<uint8_t> held;  // per entry: the arena holds its memory (GroupShape::held)
  // The job's ranks: their agreements (the slots, the cache's lines, the bandwidths), each
  // bounded by timeout_s and named (TimeoutError: a rank that never arrives).
  comm::ControlPlane plane;
  std::unique_ptr<HostArena> arena;
  std::unique_ptr<UpdateQueue> updates;  // the owner's CPU steps (goes before arena)
  std::vector<uint64_t> expected;        // per entry: updates counted so far
  Fence last_d2h;                        // the latest D2H ever (the destructor waits)
  int64_t now = -1;                      // the current step
  mutable std::mutex stats_mu;
  StoreStats stats;
};

}  // namespace thetad::offload
