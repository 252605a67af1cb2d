// Belady/LRU slot replacement policy (see slot_cache.hpp).
#include "offload/slot_cache.hpp"

#include "common/errors.hpp"

namespace thetad::offload {

SlotCache::SlotCache(int64_t slots) {
  THETAD_CHECK(slots >= 1, ConfigError, "offload.device_slots must be >= 1 (got ", slots,
               "); set offload.device_slots or offload.device_budget_mb to hold at least one group");
  slot_key_.resize(static_cast<size_t>(slots));
}

std::optional<int> SlotCache::lookup(Key key) const {
  auto it = where_.find(key);
  if (it == where_.end()) return std::nullopt;
  return it->second.slot;
}

int SlotCache::choose_slot(const Future& future, std::optional<Key>* victim,
                           int64_t* victim_next) const {
  for (size_t s = 0; s < slot_key_.size(); ++s)
    if (!slot_key_[s]) {
      *victim_next = kNever;
      return static_cast<int>(s);
    }
  int best = -1;
  int64_t best_next = 0;
  uint64_t best_last = 0;
  for (size_t s = 0; s < slot_key_.size(); ++s) {
    const Key k = *slot_key_[s];
    const Entry& e = where_.at(k);
    if (e.pinned) continue;
    const int64_t next = future ? future(k) : kNever;
    // Farthest next use wins; among equals the least recently used.
    if (best < 0 || next > best_next || (next == best_next && e.last_use < best_last)) {
      best = static_cast<int>(s);
      best_next = next;
      best_last = e.last_use;
    }
  }
  if (best >= 0) {
    *victim = slot_key_[static_cast<size_t>(best)];
    *victim_next = best_next;
  }
  return best;
}

SlotCache::Result SlotCache::place(Key key, int slot, std::optional<Key> victim, bool pin) {
  if (victim) where_.erase(*victim);
  slot_key_[static_cast<size_t>(slot)] = key;
  where_[key] = Entry{slot, pin, ++clock_};
  Result r;
  r.hit = false;
  r.slot = slot;
  r.evicted = victim;
  return r;
}

SlotCache::Result SlotCache::access(Key key, bool pin, const Future& future) {
  auto it = where_.find(key);
  if (it != where_.end()) {
    it->second.last_use = ++clock_;
    it->second.pinned = it->second.pinned || pin;
    return Result{true, it->second.slot, std::nullopt};
  }
  std::optional<Key> victim;
  int64_t victim_next = 0;
  const int slot = choose_slot(future, &victim, &victim_next);
  THETAD_CHECK(slot >= 0, InternalError, "device slot cache: all ", slot_key_.size(),
               " slots are pinned by the current step and unit ", key,
               " needs one; raise offload.device_slots / offload.device_budget_mb");
  return place(key, slot, victim, pin);
}

std::optional<SlotCache::Result> SlotCache::try_insert(Key key, int64_t next_use,
                                                       const Future& future) {
  auto it = where_.find(key);
  if (it != where_.end()) return Result{true, it->second.slot, std::nullopt};
  std::optional<Key> victim;
  int64_t victim_next = 0;
  const int slot = choose_slot(future, &victim, &victim_next);
  if (slot < 0) return std::nullopt;
  if (victim && victim_next <= next_use) return std::nullopt;
  return place(key, slot, victim, false);
}

void SlotCache::unpin(Key key) {
  auto it = where_.find(key);
  if (it != where_.end()) it->second.pinned = false;
}

void SlotCache::unpin_all() {
  for (auto& kv : where_) kv.second.pinned = false;
}

bool SlotCache::pinned(Key key) const {
  auto it = where_.find(key);
  return it != where_.end() && it->second.pinned;
}

void SlotCache::erase(Key key) {
  auto it = where_.find(key);
  if (it == where_.end()) return;
  slot_key_[static_cast<size_t>(it->second.slot)].reset();
  where_.erase(it);
}

}  // namespace thetad::offload
