// Unit tests of plan_store and row_shards: pure functions, so no processes are needed.
#include <gtest/gtest.h>

#include "common/errors.hpp"
#include "offload/store_plan.hpp"

using namespace thetad::offload;

namespace {

StorePlanOptions slots(int64_t n, size_t shard_bytes = 0) {
  StorePlanOptions o;
  o.device_slots = n;
  o.shard_bytes = shard_bytes;
  return o;
}

StorePlanOptions budget(size_t bytes, size_t shard_bytes = 0) {
  StorePlanOptions o;
  o.device_budget_bytes = bytes;
  o.shard_bytes = shard_bytes;
  return o;
}

// Every group's units tile it: in order, contiguous, each a whole number of rows.
void expect_tiles(const StorePlan& p, const std::vector<GroupShape>& groups) {
  ASSERT_EQ(p.group_units.size(), groups.size());
  ASSERT_EQ(p.index.size(), groups.size());
  int next = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const GroupShape& g = groups[gi];
    EXPECT_EQ(p.index.entry_of(g.group), gi);
    EXPECT_EQ(p.index.group_of(gi), g.group);
    EXPECT_EQ(p.group_numel[gi], g.rows * g.row_elems);
    size_t row = 0;
    for (size_t k = 0; k < p.group_units[gi].size(); ++k) {
      const int u = p.group_units[gi][k];
      EXPECT_EQ(u, next++) << "units are numbered group by group";
      const UnitInfo& info = p.units[static_cast<size_t>(u)];
      EXPECT_EQ(info.group, g.group);
      EXPECT_EQ(info.shard, static_cast<int>(k));
      EXPECT_EQ(info.row_begin, row);
      EXPECT_EQ(info.row_elems, g.row_elems);
      EXPECT_EQ(info.numel, info.rows * g.row_elems);
      EXPECT_EQ(info.offset, row * g.row_elems);
      EXPECT_LE(info.numel * sizeof(float), p.slot_bytes);
      row += info.rows;
    }
    EXPECT_EQ(row, g.rows);
  }
  EXPECT_EQ(p.units.size(), static_cast<size_t>(next));
}

}  // namespace

TEST(RowShards, WholeGroupWithoutShardingOrWhenItFits) {
  using Shards = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(row_shards(10, 3, 0), (Shards{{0, 10}}));
  EXPECT_EQ(row_shards(10, 3, 120), (Shards{{0, 10}}));  // exactly 120 bytes
}

TEST(RowShards, RowsPerShardFromTheShardSize) {
  using Shards = std::vector<std::pair<size_t, size_t>>;
  // 12 bytes a row, 40-byte shards: 3 rows each, the last one short.
  EXPECT_EQ(row_shards(10, 3, 40), (Shards{{0, 3}, {3, 3}, {6, 3}, {9, 1}}));
  // A shard smaller than a row still holds one row.
  EXPECT_EQ(row_shards(3, 4, 8), (Shards{{0, 1}, {1, 1}, {2, 1}}));
}

TEST(StorePlan, OneUnitPerGroupWithoutSharding) {
  const std::vector<GroupShape> g = {{1, 100, 1}, {2, 37, 1}, {3, 40, 33}, {5, 300, 1}};
  const StorePlan p = plan_store(g, slots(2));
  expect_tiles(p, g);
  EXPECT_EQ(p.units.size(), 4u);
  EXPECT_EQ(p.slot_bytes, 40u * 33 * sizeof(float));  // the largest group
  EXPECT_EQ(p.slots, 2);
}

TEST(StorePlan, ShardsLargeGroupsByRows) {
  const std::vector<GroupShape> g = {{1, 100, 1}, {2, 40, 33}, {3, 8, 9}};
  const size_t shard = 10 * 33 * sizeof(float);  // 10 rows of group 2
  const StorePlan p = plan_store(g, slots(3, shard));
  expect_tiles(p, g);
  EXPECT_EQ(p.group_units[0].size(), 1u);  // 400 bytes: fits
  EXPECT_EQ(p.group_units[1].size(), 4u);
  EXPECT_EQ(p.group_units[2].size(), 1u);
  EXPECT_EQ(p.slot_bytes, shard);
}

TEST(StorePlan, SlotsNeverMoreThanUnits) {
  const std::vector<GroupShape> g = {{1, 10, 1}, {2, 10, 1}};
  EXPECT_EQ(plan_store(g, slots(8)).slots, 2);
}

TEST(StorePlan, BudgetBuysSlotsOfTheLargestUnit) {
  const std::vector<GroupShape> g = {{1, 100, 1}, {2, 50, 1}, {3, 10, 1}, {4, 10, 1}, {5, 10, 1}};
  const StorePlan p = plan_store(g, budget(1000));  // 400-byte slots: 2 fit
  EXPECT_EQ(p.slot_bytes, 400u);
  EXPECT_EQ(p.slots, 2);
  // The budget replaces device_slots, even an invalid one.
  StorePlanOptions o = budget(4000);
  o.device_slots = 0;
  EXPECT_EQ(plan_store(g, o).slots, 5);  // 10 would fit; 5 units
}

TEST(StorePlan, SettingsThatCannotWorkNameTheirKey) {
  const std::vector<GroupShape> g = {{1, 100, 1}, {2, 40, 33}};
  const auto expect_config = [&](const StorePlanOptions& o, const std::string& key) {
    try {
      plan_store(g, o);
      ADD_FAILURE() << "no ConfigError; expected one naming " << key;
    } catch (const thetad::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  expect_config(slots(0), "offload.device_slots");
  expect_config(budget(1000), "offload.device_budget_mb");              // group 2 is 5280 bytes
  expect_config(slots(2, 100), "offload.shard_mb");                     // a row is 132 bytes
  expect_config(budget(500, 600), "offload.device_budget_mb");          // shards of 4 rows: 528 bytes
}

TEST(StorePlan, MalformedGroupsAreBugs) {
  EXPECT_THROW(plan_store({{0, 10, 1}}, slots(1)), thetad::InternalError);
  EXPECT_THROW(plan_store({{1, 0, 1}}, slots(1)), thetad::InternalError);
  EXPECT_THROW(plan_store({{1, 10, 1}, {1, 5, 1}}, slots(1)), thetad::InternalError);
}

TEST(GroupIndex, MapsGroupIdsToEntriesInOrder) {
  const GroupIndex ix({{7, 1, 1}, {2, 1, 1}, {5, 1, 1}});
  EXPECT_EQ(ix.size(), 3u);
  EXPECT_EQ(ix.entry_of(7), 0u);
  EXPECT_EQ(ix.entry_of(2), 1u);
  EXPECT_EQ(ix.entry_of(5), 2u);
  EXPECT_EQ(ix.group_of(1), 2);
  EXPECT_TRUE(ix.contains(5));
  EXPECT_FALSE(ix.contains(3));
  EXPECT_THROW(ix.entry_of(3), thetad::InternalError);
}
