// The device slot cache's eviction policy, with no memory behind it: which key sits in which of
// N slots, hits and misses, and which key a miss evicts. Keys are the store's units (one per
// group, or one per row shard of a sharded group).
//
// Eviction is Belady's: among unpinned keys, the one whose next use (future(key), a step number,
// INT64_MAX when unknown) is farthest away; ties, and every choice when no future callback is
// given, go to the least recently used. Keys pinned for the current step are never evicted.
//
//   SlotCache cache(4);
//   auto r = cache.access(unit, /*pin=*/true, future);   // r.hit, r.slot, r.evicted
//   ...
//   cache.unpin_all();                                     // at the end of the step
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <vector>

namespace thetad::offload {

class SlotCache {
 public:
  using Key = int64_t;
  using Future = std::function<int64_t(Key)>;  // next step the key is needed; INT64_MAX = unknown
  static constexpr int64_t kNever = INT64_MAX;

  struct Result {
    bool hit = false;
    int slot = -1;
    std::optional<Key> evicted;  // the key whose slot was taken, on a miss with no free slot
  };

  // slots >= 1, else ConfigError.
  explicit SlotCache(int64_t slots);

  int64_t slots() const { return static_cast<int64_t>(slot_key_.size()); }

  // Slot of key if resident; no change to recency.
  std::optional<int> lookup(Key key) const;

  // Makes key resident: a hit refreshes its recency; a miss takes a free slot or evicts per
  // the policy. pin=true pins it until unpin/unpin_all. Throws InternalError if a slot is needed
  // and every slot is pinned.
  Result access(Key key, bool pin, const Future& future = nullptr);

  // Prefetch flavour: inserts key (unpinned) only if a slot is free or the victim's next use is
  // later than next_use, so a prefetch never pushes out something needed sooner. A resident key
  // is left alone and reported as a hit. Returns nullopt when nothing was inserted.
  std::optional<Result> try_insert(Key key, int64_t next_use, const Future& future = nullptr);

  void unpin(Key key);
  void unpin_all();
  bool pinned(Key key) const;

  // Drops key from the cache (its slot becomes free).
  void erase(Key key);

  // Number of resident keys.
  size_t size() const { return where_.size(); }

 private:
  struct Entry {
    int slot;
    bool pinned;
    uint64_t last_use;
  };
  // Free slot or victim slot per the policy; -1 if all pinned. Victim key in *victim.
  int choose_slot(const Future& future, std::optional<Key>* victim, int64_t* victim_next) const;
  Result place(Key key, int slot, std::optional<Key> victim, bool pin);

  std::vector<std::optional<Key>> slot_key_;
  std::unordered_map<Key, Entry> where_;
  uint64_t clock_ = 0;
};

}  // namespace thetad::offload
