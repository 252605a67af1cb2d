// Unit tests of make_bucket_plan: a pure function, so no processes are needed.
#include <gtest/gtest.h>

#include <set>

#include "comm/bucket_plan.hpp"
#include "common/errors.hpp"

using namespace thetad::comm;

namespace {

BucketPlanOptions opts(size_t cap, size_t first) {
  BucketPlanOptions o;
  o.bucket_cap_bytes = cap;
  o.first_bucket_bytes = first;
  return o;
}

// A trunk (group 0) registered first, then heads of groups 1..T, as the built-in models do.
std::vector<ParamInfo> model(int tasks, size_t trunk_numel = 100, int trunk_params = 6) {
  std::vector<ParamInfo> ps;
  for (int i = 0; i < trunk_params; ++i) ps.push_back({"trunk." + std::to_string(i), trunk_numel, 0});
  for (int t = 1; t <= tasks; ++t) {
    ps.push_back({"heads." + std::to_string(t) + ".weight", 40, t});
    ps.push_back({"heads." + std::to_string(t) + ".bias", 4, t});
  }
  return ps;
}

void expect_valid(const BucketPlan& plan, const std::vector<ParamInfo>& ps) {
  std::set<int> seen;
  for (size_t bi = 0; bi < plan.buckets.size(); ++bi) {
    const Bucket& b = plan.buckets[bi];
    EXPECT_EQ(b.index, static_cast<int>(bi));
    size_t off = 0;
    for (size_t k = 0; k < b.params.size(); ++k) {
      const int p = b.params[k];
      EXPECT_EQ(ps[p].group, b.group) << "bucket " << bi << " mixes groups";
      EXPECT_EQ(b.offsets[k], off);
      EXPECT_EQ(plan.param_bucket[p], b.index);
      EXPECT_EQ(plan.param_offset[p], off);
      if (k > 0) {
        EXPECT_LT(p, b.params[k - 1]) << "not in reverse registration order";
      }
      off += ps[p].numel;
      EXPECT_TRUE(seen.insert(p).second);
    }
    EXPECT_EQ(b.numel, off);
  }
  for (size_t p = 0; p < ps.size(); ++p) {  // every parameter with elements is in exactly one bucket
    if (ps[p].numel == 0) {
      EXPECT_EQ(plan.param_bucket[p], -1) << "placeholder " << ps[p].name << " got a bucket";
    } else {
      EXPECT_EQ(seen.count(static_cast<int>(p)), 1u) << ps[p].name;
    }
  }
  for (int g = 0; g < plan.num_groups; ++g)
    for (size_t k = 0; k < plan.group_buckets[g].size(); ++k) {
      EXPECT_EQ(plan.buckets[plan.group_buckets[g][k]].group, g);
      if (k) {
        EXPECT_LT(plan.group_buckets[g][k - 1], plan.group_buckets[g][k]);
      }
    }
}

}  // namespace

TEST(BucketPlan, GroupPurityOrderAndOffsets) {
  auto ps = model(5);
  auto plan = make_bucket_plan(ps, 6, opts(1000, 200));
  expect_valid(plan, ps);
  EXPECT_EQ(plan.num_groups, 6);
}

TEST(BucketPlan, CapsAreRespected) {
  auto ps = model(3, 100, 20);  // trunk: 20 params of 400 bytes
  auto plan = make_bucket_plan(ps, 4, opts(1200, 500));
  expect_valid(plan, ps);
  for (const Bucket& b : plan.buckets) EXPECT_LE(b.numel * 4, 1200u);
  // The trunk's 8000 bytes need at least 7 buckets of at most 1200.
  EXPECT_GE(plan.group_buckets[0].size(), 7u);
  // Buckets are filled up to the cap: all trunk buckets but the last hold 3 params.
  for (size_t k = 0; k + 1 < plan.group_buckets[0].size(); ++k)
    EXPECT_EQ(plan.buckets[plan.group_buckets[0][k]].params.size(), 3u);
}

TEST(BucketPlan, FirstBucketIsSmallAndHoldsTheLastParameter) {
  std::vector<ParamInfo> ps;
  for (int i = 0; i < 10; ++i) ps.push_back({"p" + std::to_string(i), 64, 0});  // 256 B each
  auto plan = make_bucket_plan(ps, 1, opts(1024, 256));
  expect_valid(plan, ps);
  ASSERT_GE(plan.buckets.size(), 2u);
  EXPECT_EQ(plan.buckets[0].params, std::vector<int>{9});
  EXPECT_EQ(plan.buckets[1].params, (std::vector<int>{8, 7, 6, 5}));
  EXPECT_EQ(plan.buckets.size(), 4u);  // 1 + 4 + 4 + 1
}

TEST(BucketPlan, BucketIndicesFollowBackwardOrder) {
  auto ps = model(4);
  auto plan = make_bucket_plan(ps, 5, opts(1 << 20, 1 << 20));
  expect_valid(plan, ps);
  // Everything fits a bucket per group; heads come back first (last registered), task 4 first.
  ASSERT_EQ(plan.buckets.size(), 5u);
  EXPECT_EQ(plan.buckets[0].group, 4);
  EXPECT_EQ(plan.buckets[1].group, 3);
  EXPECT_EQ(plan.buckets[3].group, 1);
  EXPECT_EQ(plan.buckets[4].group, 0);
}

TEST(BucketPlan, HugeParameterGetsItsOwnBucket) {
  std::vector<ParamInfo> ps = {{"a", 10, 0}, {"huge", 100000, 0}, {"b", 10, 0}, {"c", 10, 0}};
  auto plan = make_bucket_plan(ps, 1, opts(1000, 1000));
  expect_valid(plan, ps);
  const Bucket& hb = plan.buckets[plan.param_bucket[1]];
  EXPECT_EQ(hb.params, std::vector<int>{1});
  EXPECT_EQ(hb.numel, 100000u);
  EXPECT_EQ(plan.buckets.size(), 3u);  // {c,b} {huge} {a}
}

TEST(BucketPlan, EmptyGroupsAndZeroSizedParams) {
  std::vector<ParamInfo> ps = {{"a", 0, 0}, {"b", 5, 2}};
  auto plan = make_bucket_plan(ps, 4, opts(64, 64));
  expect_valid(plan, ps);
  EXPECT_TRUE(plan.group_buckets[0].empty());  // a placeholder without elements: no bucket
  EXPECT_TRUE(plan.group_buckets[1].empty());
  EXPECT_TRUE(plan.group_buckets[3].empty());
}

TEST(BucketPlan, BadGroupIsAConfigErrorNamingTheParameter) {
  std::vector<ParamInfo> ps = {{"trunk.w", 5, 0}, {"heads.9.w", 5, 9}};
  try {
    make_bucket_plan(ps, 4, opts(64, 64));
    FAIL() << "no error";
  } catch (const thetad::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("heads.9.w"), std::string::npos) << e.what();
  }
}

TEST(BucketPlan, Deterministic) {
  auto ps = model(7, 333, 9);
  auto a = make_bucket_plan(ps, 8, opts(2000, 500));
  auto b = make_bucket_plan(ps, 8, opts(2000, 500));
  EXPECT_EQ(a.hash, b.hash);
  EXPECT_EQ(a.describe(), b.describe());
  ASSERT_EQ(a.buckets.size(), b.buckets.size());
  for (size_t i = 0; i < a.buckets.size(); ++i) EXPECT_EQ(a.buckets[i].params, b.buckets[i].params);
}

TEST(BucketPlan, HashChangesWithNameSizeGroupAndOptions) {
  auto ps = model(3);
  const uint64_t base = make_bucket_plan(ps, 4, opts(1000, 200)).hash;
  auto renamed = ps;
  renamed[2].name = "trunk.renamed";
  EXPECT_NE(make_bucket_plan(renamed, 4, opts(1000, 200)).hash, base);
  auto resized = ps;
  resized[2].numel += 1;
  EXPECT_NE(make_bucket_plan(resized, 4, opts(1000, 200)).hash, base);
  auto regrouped = ps;
  regrouped.back().group = 2;
  EXPECT_NE(make_bucket_plan(regrouped, 4, opts(1000, 200)).hash, base);
  EXPECT_NE(make_bucket_plan(ps, 5, opts(1000, 200)).hash, base);
  EXPECT_NE(make_bucket_plan(ps, 4, opts(1004, 200)).hash, base);
  EXPECT_NE(make_bucket_plan(ps, 4, opts(1000, 204)).hash, base);
  EXPECT_NE(base, 0u);
}

TEST(BucketPlan, DescribeNamesEveryParameter) {
  auto ps = model(2);
  auto plan = make_bucket_plan(ps, 3, opts(1000, 200));
  const std::string d = plan.describe();
  for (const auto& p : ps) EXPECT_NE(d.find(p.name), std::string::npos) << p.name;
  EXPECT_EQ(fnv1a64(std::string("")), 14695981039346656037ull);  // the FNV-1a offset basis
  EXPECT_EQ(fnv1a64(std::string("a")), 0xaf63dc4c8601ec8cull);
}

TEST(BucketPlan, AloneParamsAndPlaceholders) {
  std::vector<ParamInfo> ps{{"a", 10, 0}, {"b", 10, 0}, {"w", 0, 1}, {"w[0:2]", 8, 1, true}, {"w[2:4]", 8, 1, true}};
  BucketPlanOptions o;
  o.bucket_cap_bytes = 1 << 20;
  o.first_bucket_bytes = 1 << 20;
  const BucketPlan plan = make_bucket_plan(ps, 2, o);
  EXPECT_EQ(plan.param_bucket[2], -1);
  ASSERT_EQ(plan.buckets.size(), 3u);
  EXPECT_EQ(plan.buckets[0].params, std::vector<int>{4});  // backward order: the last shard first
  EXPECT_EQ(plan.buckets[1].params, std::vector<int>{3});
  EXPECT_EQ(plan.buckets[2].params, (std::vector<int>{1, 0}));
  std::vector<ParamInfo> together = ps;
  together[3].alone = together[4].alone = false;
  EXPECT_NE(make_bucket_plan(together, 2, o).hash, plan.hash);
}
