// The host-resident parameter store: every offloaded group θ[t] (t >= 1) lives with its Adam
// state in the host arena shared by the host's ranks; a device cache of slots holds the units
// (groups, or row shards of large groups) the current step needs, prefetched from the known
// schedule. Gradients go device->host as they are ready; each group's owner on the host runs
// CPU Adam/AdamW there; updated values go host->device only when the group is needed again.
//
// One step on every rank (s = step), in this order:
//
//   for (int u : store.plan().units_of(g))  ptr = store.acquire(u, s);    // each group this rank uses
//   store.prefetch_for(s);            // during forward: units needed at s+1 .. s+prefetch
//   ... forward/backward; sharded groups may call store.release(u) after each shard ...
//   for each globally active offloaded group g (same list, same order on every rank):
//     for (int u : store.plan().units_of(g)) store.push_grad(u, reduced_grad_of_unit);  // owner copies
//     store.step_group(g, hyper);     // every rank; the owner's CPU step may run asynchronously
//   store.release_step(s);
//
// With a device cache (StoreOptions::cache_bytes, and the job's schedule of every rank), flat
// groups of one unit (not row-sharded matrices) are placed per step by DeviceCachePolicy: at the start of each step,
// before its acquires, every rank calls
//   store.place(s);                   // loads (params, m, v) into lines, flushes evicted ones
// A cached group (store.cache(), store_lines.hpp) is not acquired, pushed or stepped on the host:
// the caller binds its tensors to cache().cached_params/_exp_avg/_exp_avg_sq, keeps its reduced gradient on the device, runs
// the device AdamW there and then calls step_group (which only counts the update). Evicted, it
// goes to the host with its state (the owner's D2H copies) and takes the host path again.
//
// Groups no rank used at a step are not stepped (lazy Adam: their m, v and step count stay).
// Every rank calls step_group for every globally active group so that all agree on each group's
// update count; acquire() waits until the owner's update has landed. With a CUDA device all
// copies are ordered against the compute stream by events; nothing synchronizes the device.
// Construction and destruction are collective over the host's ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "offload/cpu_adam.hpp"
#include "offload/device.hpp"
#include "offload/host_arena.hpp"
#include "offload/slot_cache.hpp"
#include "offload/store_core.hpp"
#include "offload/store_lines.hpp"
#include "offload/store_plan.hpp"
#include "offload/update_lines.hpp"

namespace thetad::offload {

class ParamStore {
 public:
  // This rank's offloaded groups needed at a step: deterministic, any step >= 0. Group 0 is
  // ignored; an id that is not one of the store's groups is an InternalError.
  using Schedule = std::function<std::vector<int>(int64_t step)>;

  // Throws ConfigError for bad settings (slots < 1, a unit larger than the budget without
  // sharding, a row larger than the shard size, an arena over the host limit or memory), and
  // TimeoutError naming the agreement a rank of the job never came to (comm.timeout_s: the
  // arena is then left to the process's exit, comm::abandon_node_memory). Collective over the
  // job's ranks; the arena over each node's (comm/node_memory.hpp).
  // groups_used_at: every rank's groups at a step (the device cache's placement; null: no cache).
  ParamStore(const StoreOptions& opts, std::vector<GroupShape> groups, Device& device,
             Schedule groups_needed_at, Schedule groups_used_at = nullptr);
  ~ParamStore();
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  // The units (plan().units_of(group), plan().unit(u)) and the slots (plan().slots of
  // plan().slot_bytes each).
  const StorePlan& plan() const { return core_.plan; }
  const HostArena& arena() const { return *core_.arena; }
  // The CPU Adam threads this rank should run (cpu_adam_threads: offload.cpu_threads, else a
  // share of the host's CPUs among its ranks). The store does not resize the process-wide pool:
  // the trainer sizes it once, before anything is built, by the same rule.
  size_t cpu_threads() const { return cpu_threads_; }
  // Whether the host arena holds the group (GroupShape::held): a group it does not hold is never
  // used, read or written through the store; its values are the initial ones.
  bool held(int group) const { return core_.held[core_.index_of(group)] != 0; }
  // The device cache: whether a group is in a line now, its line's memory, its size.
  CacheLines& cache() { return *lines_; }

  // Start of step `step`, before its acquires: the cache's evictions (the owner copies params, m
  // and v to the arena after the compute queued so far) and loads (after the group's pending
  // host update; the compute stream waits for them). Every rank, in step order. prefetch_for(s)
  // already loads the groups of step s+1 that free lines can take (not used at s): their copies
  // overlap step s, and place(s+1) makes the compute stream wait for them.
  void place(int64_t step);

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
  void* d2h_stream() { return core_.device.d2h_stream(); }
  // Every rank, for every globally active group: counts the update; the owner runs adam_step
  // on the arena once its gradient copies have landed (on the worker thread when async_step).
  void step_group(int group, const AdamHyper& hyper);
  // Waits until this rank's queued optimizer steps are done (TimeoutError after timeout_s).
  void wait_idle();

  // The update lines (StoreOptions::update_lines, update_lines.hpp): a group updated on the
  // device within a step instead of by its owner's CPU AdamW. load_for_update: its values, m and
  // v in a line (device memory: m at update_line_numel() floats after the values, v after m),
  // the compute stream ordered after them. updated_on_device, every rank, once the caller's
  // device AdamW of the line is queued on the compute stream: counts the update (in place of
  // step_group) and the owner copies the line back to the arena.
  // `order_compute` false: a prefetch (see acquire); order_update(group) before compute reads it.
  // update_room(): whether a prefetch would leave a line for the group about to be updated.
  float* load_for_update(int group, bool order_compute = true);
  void order_update(int group);
  bool update_room() const { return update_lines_ && update_lines_->free_lines() > 1; }
  bool in_update_line(int group) const { return update_lines_ && update_lines_->holds(core_.index_of(group)); }
  size_t update_line_numel() const { return update_lines_ ? update_lines_->line_numel() : 0; }
  size_t update_line_bytes() const { return update_lines_ ? update_lines_->bytes() : 0; }
  void updated_on_device(int group);
  // Frees the update lines (a split that chose none: its probe was their only use). Before any
  // group is loaded into one; the device memory goes back at once.
  void drop_update_lines();
  // The PCIe and CPU AdamW bandwidths, probed on an update line and agreed over the ranks
  // (collective; the split's inputs).
  UpdateBandwidths update_bandwidths();

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

  size_t index_of(int group) const { return core_.index_of(group); }
  std::string held_groups_note() const;  // for the log: how many groups the arena holds
  const std::vector<int>& needed_at(int64_t step);
  int64_t next_use(int unit);
  void begin_step(int64_t step);
  void copy_in(int unit, int slot);
  void alloc_slots();
  void alloc_update_lines();
  void free_slots() noexcept;
  void push(size_t gi, size_t offset, const float* src, size_t numel, const Fence& after);

  StoreCore core_;  // first built, last gone: the arena and the update queue
  Schedule schedule_;
  size_t cpu_threads_ = 1;
  SlotCache slots_;
  std::vector<void*> slot_mem_;
  std::vector<void*> slot_stage_;   // per slot (bf16_copies): the bf16 values before widening
  std::vector<Fence> slot_free_;    // per slot: compute done with its previous contents
  std::vector<uint64_t> version_;   // per unit: update count its device copy holds
  std::vector<Fence> copied_;       // per unit: its last H2D copy
  std::vector<uint8_t> released_;   // per unit: released early in the current step
  std::vector<int> pinned_;         // units pinned in the current step
  std::vector<std::vector<Fence>> grad_fences_;  // per entry (owner): pending D2H copies
  Fence last_push_;                              // the latest of them (one in-order stream)
  std::map<int64_t, std::vector<int>> schedule_cache_;
  std::unique_ptr<CacheLines> lines_;           // the device cache (goes before core_)
  std::unique_ptr<UpdateLines> update_lines_;   // StoreOptions::update_lines (goes before core_)
  std::vector<float> scratch_;                  // group_params of a cached group
  size_t scratch_entry_ = SIZE_MAX;             // whose values scratch_ holds
  uint64_t scratch_version_ = 0;                // at which update count
};

}  // namespace thetad::offload
