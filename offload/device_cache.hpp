// The device cache's placement policy, with no memory behind it: which offloaded groups live on
// the device, with their Adam state (a write-back cache: a cached group is updated there by the
// device AdamW and goes back to the host only when it is evicted), and where the others are
// updated at a step that uses them: by the owner's CPU AdamW in the host store (the step swaps
// in their values and sends their gradient to the host), or on the device with their Adam state
// streamed in for the step and back out after it (a transit line).
//
// Every rank of the job must place alike (a cached group is updated on every rank's device, as
// an all-resident one is), so the policy reads the job's schedule, all ranks' groups, not this
// rank's: decide(step) is a pure function of that schedule, the line counts and the bandwidths,
// which the ranks agree on.
//
// Eviction is Belady's with bypass, over the known schedule: a group needed now that is not
// cached takes a free line; else it takes the line of the cached group (not needed now) whose
// next use is farthest, if that is farther than its own next use; else it bypasses the cache for
// this step (caching it would evict something needed sooner). With lines >= groups everything
// is cached at its first use and stays: offload runs at the all-resident speed.
//
// A bypassing group is updated on the host, or in a transit line (lines kept out of the cache
// when the cache cannot hold every group): UncachedUpdate::Device streams every one a free
// transit line takes; Auto streams a group only where that shortens the step's slowest resource
// (PCIe each way, the host's CPU AdamW) by the measured bandwidths, soonest next use first.
//
//   DeviceCachePolicy policy(lines, cacheable, transit, numel);
//   DeviceCachePolicy::Decision d = policy.decide(step, need);   // need(s): entries used at s
//   for (auto [entry, line] : d.evict) flush ...;  for (auto [entry, line] : d.load, d.stream) load ...
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace thetad::offload {

// Where a group that the cache does not keep is updated (offload.uncached_update).
enum class UncachedUpdate { Host, Device, Auto };

// Bandwidths in bytes per second, measured once and the same on every rank: Auto's inputs.
struct UpdateBandwidths {
  double h2d = 0, d2h = 0;  // pinned host <-> device copies
  double cpu_adam = 0;      // the CPU AdamW, counting 28 bytes per parameter (p, g, m, v read; p, m, v written)
};

class DeviceCachePolicy {
 public:
  // The entries any rank uses at a step, each once (order free).
  using Need = std::function<const std::vector<size_t>&(int64_t step)>;
  static constexpr int64_t kNever = INT64_MAX;
  // How far ahead the schedule is read; a later next use counts as never.
  static constexpr int64_t kHorizon = 64;

  struct Decision {
    std::vector<std::pair<size_t, int>> evict;  // (entry, line): flushed to the host first
    std::vector<std::pair<size_t, int>> load;   // (entry, line): loaded after the evictions
    // (entry, transit line): loaded after the evictions like `load`, updated on the device, and
    // flushed (in `evict`) at the first later step that does not use it.
    std::vector<std::pair<size_t, int>> stream;
    std::vector<size_t> bypass;                 // needed now, updated on the host
  };

  // lines >= 0, of which the last `transit` are transit lines (0 <= transit <= lines);
  // cacheable: per entry (a group that fits one line: not row-sharded); numel: per entry, its
  // parameters (Auto weighs them; may be empty otherwise).
  DeviceCachePolicy(int64_t lines, std::vector<uint8_t> cacheable, int64_t transit = 0, std::vector<size_t> numel = {});

  // How bypassing groups are updated (default Host). `measure` is called once, at the first
  // choice Auto makes (every rank at the same decide: it may be collective); where streaming
  // cannot shorten a step at the bandwidths it gives, the transit lines become cache lines from
  // the next decide on (transit_lines() 0). bf16_copies: the
  // host path sends parameters as bf16 (2 bytes) and its CPU AdamW writes them too (2 more).
  void set_uncached_update(UncachedUpdate mode, std::function<UpdateBandwidths()> measure = nullptr,
                           bool bf16_copies = false);

  int64_t lines() const { return static_cast<int64_t>(line_entry_.size()); }
  int64_t transit_lines() const { return transit_; }
  // In a line: cached, or streamed through a transit line.
  bool cached(size_t entry) const { return line_of_[entry] >= 0; }
  bool in_transit(size_t entry) const { return line_of_[entry] >= cache_lines(); }
  int line(size_t entry) const { return line_of_[entry]; }
  // Entries in a line now (cached or in transit), ascending.
  std::vector<size_t> cached_entries() const;
  // The bandwidths Auto measured (zeros before its first choice).
  const UpdateBandwidths& bandwidths() const { return bandwidths_; }

  // Places the entries needed at `step`; call once per step, steps increasing.
  Decision decide(int64_t step, const Need& need);
  // Ahead of decide(step): the entries needed at `step` that are cacheable, not cached and not in
  // `busy` (used by the step before, whose updates they would miss) take free cache lines, lowest entry
  // and line first; nothing is evicted. Returns (entry, line) pairs to load now; decide(step) then
  // finds them cached. Every rank claims alike (a function of the schedule and the lines).
  std::vector<std::pair<size_t, int>> claim_free(int64_t step, const Need& need, const std::vector<size_t>& busy);
  // Forgets a cached entry (its line becomes free): resume overwrote its values on the host.
  void drop(size_t entry);

 private:
  int cache_lines() const { return static_cast<int>(line_entry_.size() - static_cast<size_t>(transit_)); }
  bool streaming_can_pay() const;
  // The bypassing entries that go to transit lines this step (removed from `bypass`).
  std::vector<size_t> choose_streamed(std::vector<size_t>& bypass, int free_transit,
                                      const std::function<int64_t(size_t)>& next_use);

  std::vector<uint8_t> cacheable_;
  std::vector<size_t> numel_;
  int64_t transit_ = 0;
  std::vector<int> line_of_;       // per entry: its line, or -1
  std::vector<int64_t> line_entry_;  // per line: its entry, or -1
  UncachedUpdate mode_ = UncachedUpdate::Host;
  std::function<UpdateBandwidths()> measure_;
  bool bf16_copies_ = false;
  bool measured_ = false;
  UpdateBandwidths bandwidths_;
};

}  // namespace thetad::offload
