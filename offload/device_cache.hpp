// The device cache's placement policy, with no memory behind it: which offloaded groups live on
// the device, with their Adam state (a write-back cache: a cached group is updated there by the
// device AdamW and goes back to the host only when it is evicted), and which stay in the host
// store (a step that uses them swaps in their values, sends their gradient to the host and the
// owner's CPU AdamW updates them).
//
// Every rank of the job must place alike (a cached group is updated on every rank's device, as
// an all-resident one is), so the policy reads the job's schedule, all ranks' groups, not this
// rank's: decide(step) is a pure function of that schedule and the line count, which the ranks
// agree on.
//
// Eviction is Belady's with bypass, over the known schedule: a group needed now that is not
// cached takes a free line; else it takes the line of the cached group (not needed now) whose
// next use is farthest, if that is farther than its own next use; else it stays on the host for
// this step (caching it would evict something needed sooner). With lines >= groups everything
// is cached at its first use and stays: offload runs at the all-resident speed.
//
//   DeviceCachePolicy policy(lines, cacheable);
//   DeviceCachePolicy::Decision d = policy.decide(step, need);   // need(s): entries used at s
//   for (auto [entry, line] : d.evict) flush ...;  for (auto [entry, line] : d.load) load ...
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace thetad::offload {

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
    std::vector<size_t> bypass;                 // needed now, not cacheable or not worth a line
  };

  // lines >= 0; cacheable: per entry (a group that fits one line: not row-sharded).
  DeviceCachePolicy(int64_t lines, std::vector<uint8_t> cacheable);

  int64_t lines() const { return static_cast<int64_t>(line_entry_.size()); }
  bool cached(size_t entry) const { return line_of_[entry] >= 0; }
  int line(size_t entry) const { return line_of_[entry]; }
  // Entries cached now, ascending.
  std::vector<size_t> cached_entries() const;

  // Places the entries needed at `step`; call once per step, steps increasing.
  Decision decide(int64_t step, const Need& need);
  // Ahead of decide(step): the entries needed at `step` that are cacheable, not cached and not in
  // `busy` (used by the step before, whose updates they would miss) take free lines, lowest entry
  // and line first; nothing is evicted. Returns (entry, line) pairs to load now; decide(step) then
  // finds them cached. Every rank claims alike (a function of the schedule and the lines).
  std::vector<std::pair<size_t, int>> claim_free(int64_t step, const Need& need, const std::vector<size_t>& busy);
  // Forgets a cached entry (its line becomes free): resume overwrote its values on the host.
  void drop(size_t entry);

 private:
  std::vector<uint8_t> cacheable_;
  std::vector<int> line_of_;       // per entry: its line, or -1
  std::vector<int64_t> line_entry_;  // per line: its entry, or -1
};

}  // namespace thetad::offload
