// Placement (daemon/plan/placement): for a table of jobs, which home each group goes to and every
// fact that follows (the model's device, lazy task groups, the bf16 frozen base, row shards, the
// replica rule's groups, the backward train.backward resolves to).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/loader.hpp"
#include "daemon/plan/placement.hpp"

namespace thetad::daemon {
namespace {

constexpr const char* kBase =
    "job: placement\nseed: 1\nsteps: 2\n"
    "data: {kind: synthetic, batch_per_rank: 8, schedule: round_robin}\n"
    "optimizer: {kind: adamw, lr: 0.01}\n";
constexpr const char* kMlp = "model: {kind: multitask_mlp, input_dim: 8, hidden: 8, trunk_layers: 2, head_layers: 1, tasks: 3}\n";
constexpr const char* kFrozenMlp =
    "model: {kind: multitask_mlp, input_dim: 8, hidden: 8, trunk_layers: 2, head_layers: 1, tasks: 3, "
    "train_shared: false}\n";
constexpr const char* kClassifier =
    "model: {kind: extreme_classifier, input_dim: 8, hidden: 8, trunk_layers: 1, tasks: 3, classes: 30}\n";

struct Case {
  std::string name;
  std::string keys;  // after the base
  int world;
  HomeKind shared, tasks;
  bool on_host, lazy, bf16_base, shards, split;
  std::vector<uint8_t> keepable;
};

config::Job load(const std::string& keys) {
  return config::load_job_from_string(std::string(kBase) + keys, "placement.yaml");
}

TEST(Placement, DecisionsForATableOfJobs) {
  using H = HomeKind;
  const std::vector<Case> cases = {
      {"resident, one rank", kMlp, 1, H::resident, H::resident, false, false, false, false, false, {0, 0, 0, 0}},
      {"resident, two ranks: the rule keeps every group", kMlp, 2, H::resident, H::resident, false, false, false,
       false, false, {1, 1, 1, 1}},
      {"sole_user: broadcast keeps none", std::string(kMlp) + "comm: {sole_user: broadcast}\n", 2, H::resident,
       H::resident, false, false, false, false, false, {0, 0, 0, 0}},
      {"host store", std::string(kMlp) + "offload: {enabled: true}\n", 2, H::resident, H::host_store, true, true,
       false, false, false, {1, 0, 0, 0}},
      {"streamed trunk", std::string(kMlp) + "offload: {shared: stream}\n", 2, H::streamed_trunk, H::resident, true,
       false, false, false, false, {0, 1, 1, 1}},
      {"both stores", std::string(kMlp) + "offload: {enabled: true, shared: stream}\n", 4, H::streamed_trunk,
       H::host_store, true, true, false, false, false, {0, 0, 0, 0}},
      {"frozen base, fp32", kFrozenMlp, 2, H::resident, H::resident, false, false, false, false, true, {0, 1, 1, 1}},
      {"frozen base, bf16", std::string(kFrozenMlp) + "precision: bf16\n", 1, H::resident, H::resident, false, false,
       true, false, true, {0, 0, 0, 0}},
      {"frozen streamed base, bf16: float32 in its store",
       std::string(kFrozenMlp) + "precision: bf16\noffload: {shared: stream}\n", 1, H::streamed_trunk, H::resident,
       true, false, false, false, false, {0, 0, 0, 0}},
      {"classifier, whole slices", kClassifier, 1, H::resident, H::resident, false, false, false, false, false,
       {0, 0, 0, 0}},
      {"classifier, row shards", std::string(kClassifier) + "offload: {enabled: true, shard_mb: 1}\n", 1,
       H::resident, H::host_store, true, true, false, true, false, {0, 0, 0, 0}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const config::Job job = load(c.keys);
    const Placement p = Placement::of(job, c.world);
    EXPECT_EQ(p.shared, c.shared);
    EXPECT_EQ(p.tasks, c.tasks);
    EXPECT_EQ(p.home(0), c.shared);
    for (int g = 1; g <= 3; ++g) EXPECT_EQ(p.home(g), c.tasks);
    EXPECT_EQ(p.model_on_host, c.on_host);
    EXPECT_EQ(p.host_store(), c.on_host);
    EXPECT_EQ(p.lazy_tasks, c.lazy);
    EXPECT_EQ(p.frozen_base_bf16, c.bf16_base);
    EXPECT_EQ(p.row_shards, c.shards);
    EXPECT_EQ(p.split_passes, c.split);
    EXPECT_EQ(p.replica_keepable, c.keepable);
  }
}

// train.backward: joint and per_task are what they say; auto splits where the placement prefers
// it and the model's fusing does not pay.
TEST(Placement, BackwardPerTask) {
  const Placement frozen = Placement::of(load(kFrozenMlp), 1);
  const Placement trained = Placement::of(load(kMlp), 1);
  const Placement streamed = Placement::of(load(std::string(kFrozenMlp) + "offload: {shared: stream}\n"), 1);
  for (bool pays : {false, true}) {
    for (const Placement* p : {&frozen, &trained, &streamed}) {
      EXPECT_FALSE(p->backward_per_task(config::Backward::Joint, pays));
      EXPECT_TRUE(p->backward_per_task(config::Backward::PerTask, pays));
    }
    EXPECT_EQ(frozen.backward_per_task(config::Backward::Auto, pays), !pays);
    EXPECT_FALSE(trained.backward_per_task(config::Backward::Auto, pays));
    EXPECT_FALSE(streamed.backward_per_task(config::Backward::Auto, pays));
  }
}

// offload.host_groups: scheduled leaves task groups out of the host store: only with the store.
TEST(Placement, UnheldTaskGroups) {
  EXPECT_FALSE(Placement::of(load(std::string(kMlp) + "offload: {enabled: true}\n"), 1).unheld_tasks);
  EXPECT_TRUE(Placement::of(load(std::string(kMlp) + "offload: {enabled: true, host_groups: scheduled}\n"), 1).unheld_tasks);
  EXPECT_FALSE(Placement::of(load(kMlp), 1).unheld_tasks);
}

TEST(Placement, HomeNames) {
  EXPECT_STREQ(to_string(HomeKind::resident), "resident");
  EXPECT_STREQ(to_string(HomeKind::host_store), "host store");
  EXPECT_STREQ(to_string(HomeKind::streamed_trunk), "streamed trunk");
}

}  // namespace
}  // namespace thetad::daemon
