// The store's plan: a pure function of the offloaded groups' shapes and the slot settings. It
// cuts every group into units (the group, or row shards of it), names each group's arena entry,
// and sizes the device cache (slot bytes, slot count). Identical on every rank.
//
//   StorePlan p = plan_store(shapes, {.shard_bytes = 64 << 20, .device_slots = 4});
//   for (int u : p.group_units[p.index.entry_of(group)]) ... p.units[u].offset ...
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace thetad::offload {

// An offloaded group: a [rows x row_elems] fp32 matrix (a flat vector: rows = numel,
// row_elems = 1). Group ids are >= 1.
struct GroupShape {
  int group = 1;
  size_t rows = 0;
  size_t row_elems = 1;
  // false: the job never uses the group (offload.host_groups: scheduled), so the host arena
  // holds no memory for it and its values stay the initial ones, which the caller draws
  // wherever they are read. Such a group has units but is never acquired, placed or stepped.
  bool held = true;
};

// A unit of swapping: a whole group, or a row shard of it.
struct UnitInfo {
  int group = 0;
  int shard = 0;          // 0-based shard index within the group
  size_t row_begin = 0;   // first row of the shard
  size_t rows = 0;
  size_t row_elems = 1;
  size_t numel = 0;       // rows * row_elems
  size_t offset = 0;      // first element within the group (row_begin * row_elems)
};

// The row shards (first row, rows) a [rows x row_elems] group splits into with shard_bytes
// (0 = no sharding): the store's units of that group, in order.
std::vector<std::pair<size_t, size_t>> row_shards(size_t rows, size_t row_elems, size_t shard_bytes);

// The one mapping between an offloaded group's id (>= 1) and its entry: its index in the host
// arena and in the store's per-group tables, in the order the groups were given.
class GroupIndex {
 public:
  GroupIndex() = default;
  // InternalError for a group id < 1 or one given twice.
  explicit GroupIndex(const std::vector<GroupShape>& groups);
  // Appends a group as the next entry and returns that entry; InternalError as above.
  size_t add(int group);

  size_t size() const { return groups_.size(); }
  bool contains(int group) const {
    return group >= 0 && static_cast<size_t>(group) < entry_.size() && entry_[static_cast<size_t>(group)] != kNone;
  }
  // The entry of a group; InternalError when the group is not offloaded.
  size_t entry_of(int group) const;
  int group_of(size_t entry) const { return groups_[entry]; }

 private:
  static constexpr size_t kNone = SIZE_MAX;
  std::vector<int> groups_;    // entry -> group id
  // group id -> entry (kNone: not offloaded): group ids are 1 .. T, dense, and every step looks
  // several up per group it touches (10,000 groups: a hash lookup each was 2 % of a CPU step).
  std::vector<size_t> entry_;
};

struct StorePlanOptions {
  size_t shard_bytes = 0;          // > 0: groups larger than this split into row shards
  int64_t device_slots = 4;        // slots of the device cache (used when the budget is 0)
  size_t device_budget_bytes = 0;  // > 0: as many slots of the largest unit as fit in this
};

struct StorePlan {
  GroupIndex index;
  std::vector<UnitInfo> units;                 // every group's units, group by group, in order
  std::vector<std::vector<int>> group_units;   // per entry: its unit indices, ascending
  std::vector<size_t> group_numel;             // per entry: rows * row_elems
  size_t slot_bytes = 0;                       // every slot: the largest unit
  int64_t slots = 1;                           // >= 1, never more than units

  int num_units() const { return static_cast<int>(units.size()); }
  const UnitInfo& unit(int u) const { return units[static_cast<size_t>(u)]; }
  // The group's units, ascending (InternalError when the group is not offloaded).
  const std::vector<int>& units_of(int group) const { return group_units[index.entry_of(group)]; }
};

// ConfigError for user settings that cannot work (slots < 1 without a budget, a row larger than
// shard_bytes, a unit larger than the budget), naming the offload.* key that fixes it;
// InternalError for malformed groups (id < 1, empty, given twice).
StorePlan plan_store(const std::vector<GroupShape>& groups, const StorePlanOptions& opts);

}  // namespace thetad::offload
