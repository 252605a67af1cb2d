// The device cache's placement policy against hand-computed schedules: first use fills free
// lines, Belady's eviction (farthest next use) with bypass (a group used later than everything
// cached stays on the host), groups needed now are never evicted, unsharded groups only, drop;
// bypassing groups streamed through transit lines (offload.uncached_update device and auto).
#include <gtest/gtest.h>

#include <map>
#include <utility>
#include <vector>

#include "offload/device_cache.hpp"

using thetad::offload::DeviceCachePolicy;
using thetad::offload::UncachedUpdate;
using thetad::offload::UpdateBandwidths;
using Pairs = std::vector<std::pair<size_t, int>>;
using Entries = std::vector<size_t>;

namespace {

// A schedule given as a list of steps (entries used at each); nothing after its end.
struct Schedule {
  explicit Schedule(std::vector<Entries> s) : steps(std::move(s)) {}
  std::vector<Entries> steps;
  Entries none;
  DeviceCachePolicy::Need need() const {
    return [this](int64_t s) -> const Entries& {
      return s < static_cast<int64_t>(steps.size()) ? steps[static_cast<size_t>(s)] : none;
    };
  }
};

}  // namespace

TEST(DeviceCachePolicy, NoLinesBypassesEverything) {
  DeviceCachePolicy p(0, {1, 1, 1});
  Schedule s({{0, 2}});
  const auto d = p.decide(0, s.need());
  EXPECT_TRUE(d.load.empty());
  EXPECT_EQ(d.bypass, (Entries{0, 2}));
}

TEST(DeviceCachePolicy, EverythingFitsIsLoadedOnceAndStays) {
  DeviceCachePolicy p(4, {1, 1, 1, 1});
  Schedule s({{0, 1}, {2, 3}, {0, 1}, {2, 3}, {1, 2}});
  EXPECT_EQ(p.decide(0, s.need()).load, (Pairs{{0, 0}, {1, 1}}));
  EXPECT_EQ(p.decide(1, s.need()).load, (Pairs{{2, 2}, {3, 3}}));
  for (int64_t step = 2; step < 5; ++step) {
    const auto d = p.decide(step, s.need());
    EXPECT_TRUE(d.load.empty() && d.evict.empty() && d.bypass.empty()) << "step " << step;
  }
  EXPECT_EQ(p.cached_entries(), (Entries{0, 1, 2, 3}));
}

// Two lines, entries used as 0 1 | 2 | 0 | 1 | 2: at step 1, 0 is next used at step 2 and 1 at
// step 3, both sooner than 2 again (step 4): evicting either would cost a miss before 2's reuse,
// so 2 stays on the host (bypass).
TEST(DeviceCachePolicy, BypassWhenEverythingCachedIsNeededSooner) {
  DeviceCachePolicy p(2, {1, 1, 1});
  Schedule s({{0, 1}, {2}, {0}, {1}, {2}});
  p.decide(0, s.need());
  const auto d = p.decide(1, s.need());
  EXPECT_TRUE(d.load.empty());
  EXPECT_TRUE(d.evict.empty());
  EXPECT_EQ(d.bypass, (Entries{2}));
}

// Belady: at step 1 entry 2 (next used at step 2) evicts the cached entry used farthest away
// (entry 1, step 5; entry 0 is used at step 3), into entry 1's line.
TEST(DeviceCachePolicy, EvictsTheFarthestNextUse) {
  DeviceCachePolicy p(2, {1, 1, 1});
  Schedule s({{0, 1}, {2}, {2}, {0}, {}, {1}, {1}});
  p.decide(0, s.need());
  const auto d = p.decide(1, s.need());
  EXPECT_EQ(d.evict, (Pairs{{1, 1}}));
  EXPECT_EQ(d.load, (Pairs{{2, 1}}));
  EXPECT_FALSE(p.cached(1));
  EXPECT_EQ(p.line(2), 1);
  // At step 5 entry 1 comes back (and is used again at 6); neither cached entry is used after
  // step 5: the tie goes to the lowest line, entry 0's.
  p.decide(2, s.need());
  p.decide(3, s.need());
  p.decide(4, s.need());
  const auto back = p.decide(5, s.need());
  EXPECT_EQ(back.evict, (Pairs{{0, 0}}));
  EXPECT_EQ(back.load, (Pairs{{1, 0}}));
}

TEST(DeviceCachePolicy, GroupsNeededNowAreNeverEvicted) {
  DeviceCachePolicy p(2, {1, 1, 1});
  Schedule s({{0, 1}, {0, 1, 2}});
  p.decide(0, s.need());
  const auto d = p.decide(1, s.need());
  EXPECT_TRUE(d.evict.empty());
  EXPECT_EQ(d.bypass, (Entries{2}));
  EXPECT_TRUE(p.cached(0) && p.cached(1));
}

TEST(DeviceCachePolicy, ShardedGroupsStayOnTheHost) {
  DeviceCachePolicy p(3, {1, 0, 1});
  Schedule s({{0, 1, 2}});
  const auto d = p.decide(0, s.need());
  EXPECT_EQ(d.load, (Pairs{{0, 0}, {2, 1}}));
  EXPECT_EQ(d.bypass, (Entries{1}));
}

TEST(DeviceCachePolicy, DropFreesTheLine) {
  DeviceCachePolicy p(1, {1, 1});
  Schedule s({{0}, {1}, {1}});
  p.decide(0, s.need());
  p.drop(0);
  EXPECT_FALSE(p.cached(0));
  const auto d = p.decide(1, s.need());
  EXPECT_TRUE(d.evict.empty());
  EXPECT_EQ(d.load, (Pairs{{1, 0}}));
}

// prefetch_for(s) claims free lines for step s+1: entries needed then, cacheable, not cached and
// not busy at s (they would miss its updates), lowest first; no eviction; decide(s+1) finds them
// cached and loads nothing for them.
TEST(DeviceCachePolicy, ClaimFreeTakesOnlyFreeLinesForNotBusyEntries) {
  DeviceCachePolicy p(3, {1, 1, 1, 0, 1, 1});
  Schedule s({{0}, {1, 2, 3, 4, 5}, {5}});
  EXPECT_EQ(p.decide(0, s.need()).load, (Pairs{{0, 0}}));
  // Step 1's entries: 1 is busy at step 0 (say), 3 is not cacheable; 2 and 4 take lines 1 and 2;
  // 5 finds no free line and is left to decide.
  EXPECT_EQ(p.claim_free(1, s.need(), {1}), (Pairs{{2, 1}, {4, 2}}));
  EXPECT_TRUE(p.cached(2) && p.cached(4) && p.cached(0));
  // decide: 1 is never used again, no better than 0 (never either): bypass; 3 is not cacheable;
  // 5 (used again at step 2) evicts 0. The claimed 2 and 4 are not loaded again.
  const auto d = p.decide(1, s.need());
  EXPECT_EQ(d.evict, (Pairs{{0, 0}}));
  EXPECT_EQ(d.load, (Pairs{{5, 0}}));
  EXPECT_EQ(d.bypass, (Entries{1, 3}));
  // Nothing free: nothing claimed, nothing evicted by a claim.
  const auto before = p.cached_entries();
  EXPECT_TRUE(p.claim_free(2, s.need(), {}).empty());
  EXPECT_EQ(p.cached_entries(), before);
}

// offload.uncached_update: a group the cache bypasses is streamed through a transit line (the
// last lines), updated on the device for the steps that use it, and flushed at the first step
// that does not. Two cache lines and one transit line, the bypass schedule above: 2 is streamed
// at step 1, leaves at step 2, and is streamed again at step 4.
TEST(DeviceCachePolicy, DeviceStreamsBypassingGroupsThroughTransitLines) {
  DeviceCachePolicy p(3, {1, 1, 1}, /*transit=*/1);
  p.set_uncached_update(UncachedUpdate::Device);
  Schedule s({{0, 1}, {2}, {0}, {1}, {2}});
  EXPECT_EQ(p.decide(0, s.need()).load, (Pairs{{0, 0}, {1, 1}}));
  auto d = p.decide(1, s.need());
  EXPECT_TRUE(d.load.empty() && d.evict.empty() && d.bypass.empty());
  EXPECT_EQ(d.stream, (Pairs{{2, 2}}));
  EXPECT_TRUE(p.cached(2) && p.in_transit(2) && !p.in_transit(0));
  d = p.decide(2, s.need());
  EXPECT_EQ(d.evict, (Pairs{{2, 2}}));
  EXPECT_TRUE(d.load.empty() && d.stream.empty() && !p.cached(2));
  EXPECT_TRUE(p.decide(3, s.need()).evict.empty());
  EXPECT_EQ(p.decide(4, s.need()).stream, (Pairs{{2, 2}}));
}

// A streamed group used by consecutive steps stays in its transit line (no flush, no reload).
TEST(DeviceCachePolicy, AStreamedGroupUsedAgainStaysInItsTransitLine) {
  DeviceCachePolicy p(2, {1, 1}, /*transit=*/1);
  p.set_uncached_update(UncachedUpdate::Device);
  Schedule s({{0, 1}, {0, 1}, {1}, {0}});
  EXPECT_EQ(p.decide(0, s.need()).stream, (Pairs{{1, 1}}));
  const auto d = p.decide(1, s.need());
  EXPECT_TRUE(d.load.empty() && d.evict.empty() && d.stream.empty() && d.bypass.empty());
  EXPECT_TRUE(p.in_transit(1));
  EXPECT_TRUE(p.decide(2, s.need()).evict.empty());
  EXPECT_EQ(p.decide(3, s.need()).evict, (Pairs{{1, 1}}));
}

TEST(DeviceCachePolicy, HostKeepsBypassingGroupsOnTheHost) {
  DeviceCachePolicy p(3, {1, 1, 1}, /*transit=*/1);
  Schedule s({{0, 1}, {2}});
  p.decide(0, s.need());
  const auto d = p.decide(1, s.need());
  EXPECT_TRUE(d.stream.empty());
  EXPECT_EQ(d.bypass, (Entries{2}));
}

// With fewer transit lines than bypassing groups, the soonest used again is streamed (its host
// update is the one a coming step would wait for); groups that are not cacheable never are.
TEST(DeviceCachePolicy, TransitLinesGoToTheSoonestNextUse) {
  DeviceCachePolicy p(2, {1, 1, 1, 0}, /*transit=*/1);
  p.set_uncached_update(UncachedUpdate::Device);
  Schedule s({{0, 1, 2, 3}, {2, 3}, {1}});
  const auto d = p.decide(0, s.need());
  EXPECT_EQ(d.load, (Pairs{{0, 0}}));
  EXPECT_EQ(d.stream, (Pairs{{2, 1}}));
  EXPECT_EQ(d.bypass, (Entries{1, 3}));
}

// Transit lines are not free cache lines: prefetch claims never take them.
TEST(DeviceCachePolicy, ClaimFreeLeavesTransitLinesAlone) {
  DeviceCachePolicy p(3, {1, 1, 1}, /*transit=*/2);
  Schedule s({{}, {0, 1, 2}});
  EXPECT_EQ(p.claim_free(1, s.need(), {}), (Pairs{{0, 0}}));
}

// Auto streams a group where that shortens the step's slowest resource, by the measured
// bandwidths (measured once, at the first choice): a slow CPU AdamW sends the group to the
// device; slow PCIe keeps it on the host, and the transit line joins the cache. 100 parameters: on the host 400 B each way over PCIe
// and 2800 B of CPU AdamW; streamed 1200 B each way, 400 B of them before forward.
TEST(DeviceCachePolicy, AutoWeighsPcieAgainstTheCpuAdamW) {
  for (const bool slow_cpu : {true, false}) {
    DeviceCachePolicy p(3, {1, 1, 1}, /*transit=*/1, {100, 100, 100});
    int measured = 0;
    const UpdateBandwidths bw = slow_cpu ? UpdateBandwidths{1e9, 1e9, 1e8} : UpdateBandwidths{1e8, 1e8, 1e10};
    p.set_uncached_update(UncachedUpdate::Auto, [&] { return ++measured, bw; });
    Schedule s({{0, 1}, {2}, {0}, {1}, {2}});
    EXPECT_TRUE(p.decide(0, s.need()).stream.empty());
    EXPECT_EQ(measured, 0) << "nothing bypassed yet: nothing to measure";
    const auto d = p.decide(1, s.need());
    EXPECT_EQ(measured, 1);
    if (slow_cpu) {
      EXPECT_EQ(d.stream, (Pairs{{2, 2}}));
      EXPECT_TRUE(d.bypass.empty());
    } else {  // streaming never pays: the transit line becomes a cache line
      EXPECT_TRUE(d.stream.empty());
      EXPECT_EQ(d.bypass, (Entries{2}));
      EXPECT_EQ(p.transit_lines(), 0);
    }
    p.decide(2, s.need());
    p.decide(3, s.need());
    p.decide(4, s.need());
    EXPECT_EQ(measured, 1) << "measured once";
  }
}

// Auto with two bypassing groups and a CPU AdamW a little slower than PCIe: moving one group
// shortens the step, moving the second would make PCIe the slower: one is streamed, the sooner
// used. 100 parameters each, PCIe 1 GB/s each way, CPU AdamW 2 GB/s. Both on the host: PCIe
// 800 B each way (0.8 us), CPU 5600 B (2.8 us). Group 1 moved: 1600 B each way (1.6 us) + 400 B
// before forward (0.4 us) against a CPU's 1.4 us: 2.0 us. Both moved: 2.4 + 0.8 = 3.2 us.
TEST(DeviceCachePolicy, AutoStopsWhereStreamingMoreWouldMakePcieTheBottleneck) {
  DeviceCachePolicy p(3, {1, 1, 1}, /*transit=*/2, {100, 100, 100});
  p.set_uncached_update(UncachedUpdate::Auto, [] { return UpdateBandwidths{1e9, 1e9, 2e9}; });
  Schedule s({{0, 1, 2}, {1}, {2}});
  const auto d = p.decide(0, s.need());
  EXPECT_EQ(d.load, (Pairs{{0, 0}}));
  EXPECT_EQ(d.stream, (Pairs{{1, 1}}));
  EXPECT_EQ(d.bypass, (Entries{2}));
}

// A transit line flushed at this step takes its next group only after the flush: a line free
// before the step goes first. Two transit lines, groups 1 and 2 bypass in turn.
TEST(DeviceCachePolicy, ATransitLineFreeBeforeTheStepGoesFirst) {
  DeviceCachePolicy p(3, {1, 1, 1}, /*transit=*/2);
  p.set_uncached_update(UncachedUpdate::Device);
  Schedule s({{0}, {0, 1}, {0, 2}});
  p.decide(0, s.need());
  EXPECT_EQ(p.decide(1, s.need()).stream, (Pairs{{1, 1}}));
  const auto d = p.decide(2, s.need());
  EXPECT_EQ(d.evict, (Pairs{{1, 1}}));
  EXPECT_EQ(d.stream, (Pairs{{2, 2}}));
}

// Where streaming never pays, the transit lines join the cache: the group that bypassed before
// now takes the former transit line as a cache line and stays.
TEST(DeviceCachePolicy, AutoGivesTransitLinesToTheCacheWhereStreamingNeverPays) {
  DeviceCachePolicy p(3, {1, 1, 1}, /*transit=*/1, {100, 100, 100});
  p.set_uncached_update(UncachedUpdate::Auto, [] { return UpdateBandwidths{1e8, 1e8, 1e10}; });
  Schedule s({{0, 1}, {2}, {0}, {1}, {2}});
  p.decide(0, s.need());
  EXPECT_EQ(p.decide(1, s.need()).bypass, (Entries{2}));
  EXPECT_EQ(p.transit_lines(), 0);
  p.decide(2, s.need());
  p.decide(3, s.need());
  const auto d = p.decide(4, s.need());
  EXPECT_EQ(d.load, (Pairs{{2, 2}}));
  EXPECT_FALSE(p.in_transit(2));
}
