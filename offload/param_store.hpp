// The host-resident parameter store: every offloaded group θ[t] (t >= 1) lives with its Adam
// state in the host arena shared by the host's ranks; a device cache of slots holds the units
// (groups, or row shards of large groups) the current step needs, prefetched from the known
// schedule. Gradients go device->host as they are ready; each group's owner on the host runs
// CPU Adam/AdamW there; updated values go host->device only when the group is needed again.
//
// One step on every rank (s = step), in this order:
//
//   for (int u : store.units_of(g))  ptr = store.acquire(u, s);    // each group this rank uses
//   store.prefetch_for(s);            // during forward: units needed at s+1 .. s+prefetch
//   ... forward/backward; sharded groups may call store.release(u) after each shard ...
//   for each globally active offloaded group g (same list, same order on every rank):
//     for (int u : store.units_of(g)) store.push_grad(u, reduced_grad_of_unit);   // owner copies
//     store.step_group(g, hyper);     // every rank; the owner's CPU step may run asynchronously
//   store.release_step(s);
//
// With a device cache (StoreOptions::cache_bytes, and the job's schedule of every rank), flat
// groups of one unit (not row-sharded matrices) are placed per step by DeviceCachePolicy: at the start of each step,
// before its acquires, every rank calls
//   store.place(s);                   // loads (params, m, v) into lines, flushes evicted ones
// A cached group is not acquired, pushed or stepped on the host: the caller binds its tensors to
// cached_params/cached_exp_avg/cached_exp_avg_sq, keeps its reduced gradient on the device, runs
// the device AdamW there and then calls step_group (which only counts the update). Evicted, it
// goes to the host with its state (the owner's D2H copies) and takes the host path again.
//
// Groups no rank used at a step are not stepped (lazy Adam: their m, v and step count stay).
// Every rank calls step_group for every globally active group so that all agree on each group's
// update count; acquire() waits until the owner's update has landed. With a CUDA device all
// copies are ordered against the compute stream by events; nothing synchronizes the device.
// Construction and destruction are collective over the host's ranks.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "offload/cpu_adam.hpp"
#include "offload/device.hpp"
#include "offload/device_cache.hpp"
#include "offload/host_arena.hpp"
#include "offload/slot_cache.hpp"
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
  int64_t cpu_threads = 0;         // CPU Adam threads (0 = ThreadPool::default_threads)
  // Every blocking wait of the store and its arena: another rank's update, this rank's queued
  // steps, the host's agreements and barriers (TimeoutError naming what it waited for).
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

class ParamStore {
 public:
  // This rank's offloaded groups needed at a step: deterministic, any step >= 0. Group 0 is
  // ignored; an id that is not one of the store's groups is an InternalError.
  using Schedule = std::function<std::vector<int>(int64_t step)>;

  // Throws ConfigError for bad settings (slots < 1, a unit larger than the budget without
  // sharding, a row larger than the shard size, an arena over the host limit or memory).
  // comm: the ranks of the job; the node's ranks are found by comm::split_node.
  // groups_used_at: every rank's groups at a step (the device cache's placement; null: no cache).
  ParamStore(const StoreOptions& opts, std::vector<GroupShape> groups, Device& device,
             Schedule groups_needed_at, MPI_Comm comm = MPI_COMM_WORLD, Schedule groups_used_at = nullptr);
  ~ParamStore();
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  int num_units() const { return static_cast<int>(plan_.units.size()); }
  const UnitInfo& unit(int u) const { return plan_.units[static_cast<size_t>(u)]; }
  const std::vector<int>& units_of(int group) const;
  int64_t slots() const { return cache_.slots(); }
  size_t slot_bytes() const { return plan_.slot_bytes; }
  const HostArena& arena() const { return *arena_; }
  // The CPU Adam threads this rank should run (offload.cpu_threads, else a share of the host's
  // CPUs among its ranks). The store does not resize the process-wide pool itself: the caller
  // does, once, e.g. ThreadPool::configure(store.cpu_threads()).
  size_t cpu_threads() const { return cpu_threads_; }

  // The device cache: its lines (0 = none), whether a group is in it now, and its device memory.
  int64_t cache_lines() const { return lines_.lines(); }
  // Device bytes of one line: 3 x the largest group that is not row-sharded (0: no such group).
  size_t cache_line_bytes() const { return 3 * line_numel_ * sizeof(float); }
  // In a line: cached, or streamed through a transit line for this step (updated alike).
  bool cached(int group) const { return lines_.cached(index_of(group)); }
  bool in_transit(int group) const { return lines_.in_transit(index_of(group)); }
  int64_t transit_lines() const { return lines_.transit_lines(); }
  // Whether the host arena holds the group (GroupShape::held): a group it does not hold is never
  // used, read or written through the store; its values are the initial ones.
  bool held(int group) const { return held_[index_of(group)] != 0; }
  float* cached_params(int group) { return line_part(group, 0); }
  float* cached_exp_avg(int group) { return line_part(group, 1); }
  float* cached_exp_avg_sq(int group) { return line_part(group, 2); }
  // Start of step `step`, before its acquires: the cache's evictions (the owner copies params, m
  // and v to the arena after the compute queued so far) and loads (after the group's pending
  // host update; the compute stream waits for them). Every rank, in step order. prefetch_for(s)
  // already loads the groups of step s+1 that free lines can take (not used at s): their copies
  // overlap step s, and place(s+1) makes the compute stream wait for them.
  void place(int64_t step);
  // Before the step's first device update of a line's group (e.g. before backward): the compute
  // stream waits for the Adam state of the groups place() streamed into transit lines (their
  // values it already waited for; m and v crossed meanwhile, overlapping forward).
  void order_state();
  // Collective, between steps, on a store built with no cache (cache_bytes 0): gives it one of
  // `bytes` (offload.device_cache_mb: auto sizes it after the first step, once the allocator
  // holds that step's activations). Groups enter it from the next place() on.
  void size_cache(size_t bytes);

  // Startup, collective over the host's ranks: each held group's owner calls fill(group, dst) to
  // write the group's initial values straight into the arena (groups in parallel on the CPU
  // Adam threads; fill must be thread-safe) and zeroes Adam's m and v. The other ranks never
  // hold the values: no rank needs a copy of θ.
  void init_all(const std::function<void(int group, float* dst)>& fill);

  // Device pointer to the unit's current parameters, valid until release(unit) or
  // release_step(step). Waits for a pending update of its group, copies on a miss, and orders
  // the compute stream after the copy. Pins the unit. `order_compute` false: the compute stream
  // is not ordered yet (a prefetch within the step: the copy overlaps the compute queued before
  // the unit's own), and order_compute(unit) must come before compute that reads it.
  float* acquire(int unit, int64_t step, bool order_compute = true);
  // The compute stream waits for the unit's last copy (after acquire(unit, step, false)).
  void order_compute(int unit);
  // Unpins one unit before the end of the step (shard loops), once compute using it is queued.
  void release(int unit);
  // Starts copies of the units needed at steps step+1 .. step+prefetch whose values are final,
  // into free slots or slots whose unit is needed later; never evicts pinned units.
  void prefetch_for(int64_t step);
  // Unpins the step's units; their slots are reusable once queued compute is done.
  void release_step(int64_t step);

  // Owner: async device->host copy of the unit's reduced gradient (numel floats, ready on the
  // compute stream) into the landing area. Others: nothing. The copy runs on d2h_stream() and
  // nothing orders the compute stream after it (the next step's forward must not wait for it):
  // the caller keeps device_grad's memory from reuse until the copy is done, e.g. LibTorch's
  // Tensor::record_stream on d2h_stream(), or by not writing it before the next step's backward.
  void push_grad(int unit, const float* device_grad);
  // Owner: the same for `numel` floats at element `offset` of the group, copied as soon as the
  // D2H stream gets to it: the caller has ordered that stream after the values are final (e.g.
  // a bucket's allreduce: Work::block_stream(d2h_stream())), or, where copies are synchronous,
  // they are final now. A group's copies must all be pushed before its step_group. Waits while
  // the owner's previous update of the group still reads the landing area.
  void push_grad_range(int group, size_t offset, const float* device_grad, size_t numel);
  // The copies pushed for a group that is not stepped this step (no rank used it; with prune off
  // a bucket can launch before the counts say so, and is copied): forgotten, so that they do not
  // pile up. The landing area is rewritten, after them, before the group's next step.
  void discard_pushes(int group);
  // True when this rank writes the group's gradient and runs its step on this host.
  bool owns(int group) const;
  // The compute stream waits for every device->host copy pushed so far (before it overwrites
  // memory those copies read, e.g. a pooled gradient buffer bound to another group).
  void compute_after_pushes();
  // The D2H copy stream (cudaStream_t) of push_grad; nullptr where copies are synchronous.
  void* d2h_stream() { return device_.d2h_stream(); }
  // Every rank, for every globally active group: counts the update; the owner runs adam_step
  // on the arena once its gradient copies have landed (on the worker thread when async_step).
  void step_group(int group, const AdamHyper& hyper);
  // Waits until this rank's queued optimizer steps are done (TimeoutError after timeout_s).
  void wait_idle();

  // Checkpoints: copy out the group's current values (null pointers are skipped).
  void read_group(int group, float* params, float* exp_avg, float* exp_avg_sq);
  // The group's parameters where they live (the arena), once its pending update landed:
  // read-only, valid until the group is next updated. For reading a whole store without a copy.
  const float* group_params(int group);
  // Resume, collective over the host's ranks, identical values on every rank.
  void write_group(int group, const float* params, const float* exp_avg, const float* exp_avg_sq);

  StoreStats stats() const;

 private:
  static constexpr uint64_t kNoCopy = UINT64_MAX;

  size_t index_of(int group) const { return plan_.index.entry_of(group); }
  // index_of, and an InternalError for a group the arena does not hold.
  size_t held_index(int group) const;
  std::string held_groups_note() const;  // for the log: how many groups the arena holds
  const std::vector<int>& needed_at(int64_t step);
  int64_t next_use(int unit);
  void begin_step(int64_t step);
  void copy_in(int unit, int slot);
  void alloc_slots(MPI_Comm comm);
  void write_common(int group, const float* params, const float* exp_avg, const float* exp_avg_sq);
  void push(size_t gi, size_t offset, const float* src, size_t numel, const Fence& after);
  Fence copy_split(bool to_device, char* dst, const char* src, size_t bytes, const Fence& after);
  float* line_part(int group, int part);
  void alloc_lines(MPI_Comm comm);
  void log_cache(const char* when) const;
  void wait_final(size_t gi);
  // What the compute stream waits for of a line's load: all of it now, its values now and its
  // Adam state at order_state(), or nothing before the next place() (a load for the next step).
  enum class LineWait { now, values_now, next_step };
  void load_line(size_t gi, int line, LineWait wait = LineWait::now);
  void load_state(size_t gi, int line);
  UpdateBandwidths measure_bandwidths();
  void wait_early_load(int line);
  void flush_line(size_t gi, int line);
  const std::vector<size_t>& used_at(int64_t step);

  StoreOptions opts_;
  Device& device_;
  Schedule schedule_;
  StorePlan plan_;
  std::vector<uint8_t> held_;  // per entry: the arena holds its memory (GroupShape::held)
  size_t cpu_threads_ = 1;
  std::unique_ptr<HostArena> arena_;
  std::unique_ptr<UpdateQueue> updates_;  // the owner's CPU steps (before arena_ goes)
  SlotCache cache_;
  std::vector<void*> slot_mem_;
  std::vector<void*> slot_stage_;   // per slot (bf16_copies): the bf16 values before widening
  std::vector<Fence> slot_free_;    // per slot: compute done with its previous contents
  std::vector<uint64_t> version_;   // per unit: update count its device copy holds
  std::vector<Fence> copied_;       // per unit: its last H2D copy
  std::vector<uint8_t> released_;   // per unit: released early in the current step
  std::vector<int> pinned_;         // units pinned in the current step
  std::vector<uint64_t> expected_;  // per entry: updates counted so far
  std::vector<std::vector<Fence>> grad_fences_;  // per entry (owner): pending D2H copies
  Fence last_push_;                              // the latest of them (one in-order stream)
  Fence last_d2h_;                               // the latest D2H ever (the destructor waits)
  std::map<int64_t, std::vector<int>> schedule_cache_;
  // The device cache (cache_bytes > 0 and a schedule of every rank's groups).
  Schedule used_schedule_;
  MPI_Comm comm_;  // the job's ranks (the cache's line count is agreed over them)
  DeviceCachePolicy lines_{0, {}};
  size_t line_numel_ = 0;                       // floats per part (params, m, v) of a line
  std::vector<void*> line_mem_;                 // per line: 3 x line_numel_ floats
  std::vector<Fence> line_free_;                // per line: its last copy out
  std::vector<Fence> line_loaded_;              // per line: a load for the next step, not yet waited on by compute
  std::vector<Fence> state_loaded_;             // per line: Adam state streamed in, not yet waited on by compute
  std::map<int64_t, std::vector<size_t>> used_cache_;  // step -> entries any rank uses
  std::vector<float> scratch_;                  // group_params of a cached group
  size_t scratch_entry_ = SIZE_MAX;             // whose values scratch_ holds
  uint64_t scratch_version_ = 0;                // at which update count
  int64_t now_ = -1;

  mutable std::mutex stats_mu_;
  StoreStats stats_;
};

}  // namespace thetad::offload
