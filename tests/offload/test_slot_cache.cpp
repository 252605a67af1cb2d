// Slot cache policy against hand-computed schedules: hits, misses, which key is evicted,
// Belady vs LRU, pinned keys never evicted, prefetch insertion that never hurts.
#include <gtest/gtest.h>

#include <vector>

#include "common/errors.hpp"
#include "offload/slot_cache.hpp"

using thetad::offload::SlotCache;

namespace {

// The future of a fixed access sequence: next position >= pos+1 where key appears.
struct Sequence {
  std::vector<int64_t> keys;
  size_t pos = 0;
  int64_t next(int64_t key) const {
    for (size_t i = pos + 1; i < keys.size(); ++i)
      if (keys[i] == key) return static_cast<int64_t>(i);
    return SlotCache::kNever;
  }
};

}  // namespace

TEST(SlotCache, RejectsFewerThanOneSlot) {
  EXPECT_THROW(SlotCache(0), thetad::ConfigError);
  EXPECT_THROW(SlotCache(-3), thetad::ConfigError);
}

TEST(SlotCache, LruWithoutFuture) {
  SlotCache c(2);
  auto r = c.access(1, false);
  EXPECT_FALSE(r.hit);
  EXPECT_FALSE(r.evicted);
  r = c.access(2, false);
  EXPECT_FALSE(r.hit);
  EXPECT_NE(r.slot, c.lookup(1).value());
  r = c.access(1, false);  // hit, 1 becomes most recent
  EXPECT_TRUE(r.hit);
  r = c.access(3, false);  // evicts 2, the least recently used
  EXPECT_FALSE(r.hit);
  ASSERT_TRUE(r.evicted);
  EXPECT_EQ(*r.evicted, 2);
  r = c.access(2, false);  // evicts 1 (used before 3)
  ASSERT_TRUE(r.evicted);
  EXPECT_EQ(*r.evicted, 1);
  EXPECT_FALSE(c.lookup(1));
  EXPECT_TRUE(c.lookup(2));
  EXPECT_TRUE(c.lookup(3));
}

TEST(SlotCache, BeladyFarthestNextUse) {
  // Sequence 1 2 3 1 2 4 1 with 2 slots, by hand:
  //  1 miss | 2 miss | 3 miss, evict 2 (next 4 > next of 1 = 3) | 1 hit |
  //  2 miss, evict 3 (never again) | 4 miss, evict 2 (never again; 1 is next at 6) | 1 hit
  Sequence seq{{1, 2, 3, 1, 2, 4, 1}};
  SlotCache c(2);
  const std::vector<bool> hits = {false, false, false, true, false, false, true};
  const std::vector<int64_t> evicted = {-1, -1, 2, -1, 3, 2, -1};
  int h = 0, m = 0;
  for (seq.pos = 0; seq.pos < seq.keys.size(); ++seq.pos) {
    const auto r = c.access(seq.keys[seq.pos], false, [&](int64_t k) { return seq.next(k); });
    EXPECT_EQ(r.hit, hits[seq.pos]) << "at " << seq.pos;
    EXPECT_EQ(r.evicted.value_or(-1), evicted[seq.pos]) << "at " << seq.pos;
    (r.hit ? h : m) += 1;
  }
  EXPECT_EQ(h, 2);
  EXPECT_EQ(m, 5);
}

TEST(SlotCache, UnknownFutureFallsBackToLru) {
  // Keys 1 and 2 both have no known future: the least recently used (1) goes.
  SlotCache c(2);
  const auto never = [](int64_t) { return SlotCache::kNever; };
  c.access(1, false, never);
  c.access(2, false, never);
  const auto r = c.access(3, false, never);
  EXPECT_EQ(r.evicted.value_or(-1), 1);
}

TEST(SlotCache, PinnedNeverEvicted) {
  SlotCache c(2);
  // 1 is pinned and would be Belady's victim (never used again); 2 must go instead.
  const auto future = [](int64_t k) { return k == 1 ? SlotCache::kNever : int64_t{5}; };
  c.access(1, true, future);
  c.access(2, false, future);
  auto r = c.access(3, true, future);
  EXPECT_EQ(r.evicted.value_or(-1), 2);
  EXPECT_TRUE(c.pinned(1));
  EXPECT_TRUE(c.pinned(3));
  // Both slots pinned: a new key is a bug, reported, and nothing changes.
  EXPECT_THROW(c.access(4, true, future), thetad::InternalError);
  EXPECT_TRUE(c.lookup(1));
  EXPECT_TRUE(c.lookup(3));
  // A hit on a pinned key needs no slot.
  EXPECT_TRUE(c.access(1, true, future).hit);
  c.unpin(3);
  r = c.access(4, true, future);
  EXPECT_EQ(r.evicted.value_or(-1), 3);
  c.unpin_all();
  EXPECT_FALSE(c.pinned(1));
  EXPECT_FALSE(c.pinned(4));
}

TEST(SlotCache, PrefetchNeverPushesOutSoonerUse) {
  SlotCache c(1);
  int64_t next1 = 10;
  const auto future = [&](int64_t k) { return k == 1 ? next1 : int64_t{5}; };
  c.access(1, false, future);
  // 2 is needed at step 5, 1 only at 10: 1 makes room.
  auto r = c.try_insert(2, 5, future);
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->hit);
  EXPECT_EQ(r->evicted.value_or(-1), 1);
  // 3 is needed at 20 but 2 (resident) at 5: no insertion.
  EXPECT_FALSE(c.try_insert(3, 20, future));
  EXPECT_TRUE(c.lookup(2));
  // Resident key: reported as a hit, nothing moves.
  r = c.try_insert(2, 5, future);
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->hit);
  // A pinned resident is never a prefetch victim.
  c.access(2, true, future);
  EXPECT_FALSE(c.try_insert(7, 0, future));
}

TEST(SlotCache, EraseFreesSlot) {
  SlotCache c(1);
  c.access(1, false);
  c.erase(1);
  EXPECT_EQ(c.size(), 0u);
  const auto r = c.access(2, false);
  EXPECT_FALSE(r.evicted);
}
