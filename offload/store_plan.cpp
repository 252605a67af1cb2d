// The store's plan (see store_plan.hpp): units, the group index, slot size and count.
#include "offload/store_plan.hpp"

#include <algorithm>
#include <string>

#include "common/errors.hpp"
#include "offload/util.hpp"

namespace thetad::offload {

std::vector<std::pair<size_t, size_t>> row_shards(size_t rows, size_t row_elems, size_t shard_bytes) {
  const size_t row_bytes = row_elems * sizeof(float);
  size_t per = rows;
  if (shard_bytes > 0 && rows * row_bytes > shard_bytes) per = std::max<size_t>(1, shard_bytes / row_bytes);
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t r = 0; r < rows; r += per) out.emplace_back(r, std::min(per, rows - r));
  return out;
}

GroupIndex::GroupIndex(const std::vector<GroupShape>& groups) {
  for (const GroupShape& g : groups) add(g.group);
}

size_t GroupIndex::add(int group) {
  THETAD_CHECK(group >= 1, InternalError, "group ", group,
               " cannot be offloaded (group 0, the shared Θ, stays on the device)");
  const auto g = static_cast<size_t>(group);
  if (entry_.size() <= g) entry_.resize(g + 1, kNone);
  THETAD_CHECK(entry_[g] == kNone, InternalError, "group ", group, " given twice");
  entry_[g] = groups_.size();
  groups_.push_back(group);
  return groups_.size() - 1;
}

size_t GroupIndex::entry_of(int group) const {
  const size_t e = contains(group) ? entry_[static_cast<size_t>(group)] : kNone;
  THETAD_CHECK(e != kNone, InternalError, "group ", group, " is not offloaded");
  return e;
}

StorePlan plan_store(const std::vector<GroupShape>& groups, const StorePlanOptions& opts) {
  if (opts.device_budget_bytes == 0)
    THETAD_CHECK(opts.device_slots >= 1, ConfigError, "offload.device_slots must be >= 1 (got ",
                 opts.device_slots, "), or set offload.device_budget_mb");

  // Units: a group, or row shards of at most shard_bytes each.
  StorePlan plan;
  plan.group_units.resize(groups.size());
  size_t largest = 0;
  int largest_unit = -1;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const GroupShape& g = groups[gi];
    plan.index.add(g.group);
    THETAD_CHECK(g.rows > 0 && g.row_elems > 0, InternalError, "group ", g.group, " is empty");
    const size_t row_bytes = g.row_elems * sizeof(float);
    const size_t bytes = g.rows * row_bytes;
    if (opts.shard_bytes > 0 && bytes > opts.shard_bytes)
      THETAD_CHECK(row_bytes <= opts.shard_bytes, ConfigError, "offload: one row of group ",
                   g.group, " is ", mib(row_bytes), " MiB, larger than offload.shard_mb (",
                   mib(opts.shard_bytes), " MiB); groups are sharded by rows, raise offload.shard_mb");
    const auto shards = row_shards(g.rows, g.row_elems, opts.shard_bytes);
    for (size_t k = 0; k < shards.size(); ++k) {
      UnitInfo u;
      u.group = g.group;
      u.shard = static_cast<int>(k);
      u.row_begin = shards[k].first;
      u.rows = shards[k].second;
      u.row_elems = g.row_elems;
      u.numel = u.rows * u.row_elems;
      u.offset = u.row_begin * g.row_elems;
      plan.group_units[gi].push_back(static_cast<int>(plan.units.size()));
      if (u.numel * sizeof(float) > largest) {
        largest = u.numel * sizeof(float);
        largest_unit = static_cast<int>(plan.units.size());
      }
      plan.units.push_back(u);
    }
    plan.group_numel.push_back(g.rows * g.row_elems);
  }

  // Slots: all the same size, that of the largest unit.
  plan.slot_bytes = largest;
  int64_t nslots = opts.device_slots;
  if (opts.device_budget_bytes > 0) {
    const UnitInfo& big = plan.units.at(static_cast<size_t>(std::max(largest_unit, 0)));
    THETAD_CHECK(largest <= opts.device_budget_bytes, ConfigError, "offload: group ", big.group,
                 (opts.shard_bytes > 0 ? " shard " : ""),
                 (opts.shard_bytes > 0 ? std::to_string(big.shard) : std::string()), " needs ",
                 mib(largest), " MiB on the device but offload.device_budget_mb is ",
                 mib(opts.device_budget_bytes),
                 " MiB; raise offload.device_budget_mb or set offload.shard_mb (<= the budget) to "
                 "split large groups into row shards");
    nslots = static_cast<int64_t>(opts.device_budget_bytes / largest);
  }
  nslots = std::min<int64_t>(nslots, static_cast<int64_t>(plan.units.size()));  // more is waste
  plan.slots = std::max<int64_t>(nslots, 1);
  return plan;
}

}  // namespace thetad::offload
