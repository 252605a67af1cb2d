// The other side of the bounds that validate adds for what `run` would refuse later (device slots
// per step, model size, accumulation, bucket floor): the jobs just inside them, and the settings
// that skip a check, must load. The rejections are rows of test_bad_jobs.cpp.
#include <gtest/gtest.h>

#include <string>

#include "config/loader.hpp"

namespace thetad::config {
namespace {

void expect_valid(const std::string& yaml) {
  try {
    load_job_from_string(yaml, "good.yaml");
  } catch (const JobError& e) {
    ADD_FAILURE() << "rejected:\n" << yaml << "\n" << e.what();
  }
}

std::string rejection(const std::string& yaml) {
  try {
    load_job_from_string(yaml, "good.yaml");
  } catch (const JobError& e) {
    return e.what();
  }
  return "";
}

TEST(JobBounds, BenchmarkModelsStayValid) {
  // bench/: input_dim = hidden = output_dim = 4096, trunk 8, head 2, up to 1024 tasks.
  expect_valid("steps: 10\nmodel: {kind: multitask_mlp, input_dim: 4096, hidden: 4096, output_dim: 4096, "
               "trunk_layers: 8, head_layers: 2, tasks: 1024}\ndata: {batch_per_rank: 4096}\n");
  // Many tasks with tiny layers.
  expect_valid("steps: 10\nmodel: {kind: multitask_mlp, input_dim: 4, hidden: 4, tasks: 1048576}\ndata: {}\n");
  expect_valid("steps: 10\nmodel: {kind: multitask_adapter, input_dim: 4096, hidden: 4096, adapter_rank: 64, "
               "tasks: 1024}\ndata: {}\n");
  expect_valid("steps: 10\nmodel: {kind: extreme_classifier, input_dim: 4096, hidden: 4096, classes: 200000, "
               "tasks: 8}\ndata: {}\n");
  // The largest single layer allowed: 2^17 x 2^17 = 2^34 elements.
  expect_valid("steps: 10\nmodel: {kind: multitask_mlp, input_dim: 131072, hidden: 131072, trunk_layers: 1, "
               "tasks: 1}\ndata: {}\n");
}

TEST(JobBounds, AccumulationAtItsBounds) {
  expect_valid("steps: 10\naccumulate_steps: 1048576\nmodel: {kind: multitask_mlp}\ndata: {}\n");
  expect_valid("steps: 9223372036854775807\nmodel: {kind: multitask_mlp}\ndata: {}\n");
  expect_valid("steps: 9007199254740991\naccumulate_steps: 1024\nmodel: {kind: multitask_mlp}\ndata: {}\n");
  EXPECT_NE(rejection("steps: 9007199254740992\naccumulate_steps: 1024\nmodel: {kind: multitask_mlp}\ndata: {}\n")
                .find("good.yaml:1:1: steps: steps x accumulate_steps"),
            std::string::npos);
}

TEST(JobBounds, BucketFloorIsOneFloat) {
  const std::string head = "steps: 10\nmodel: {kind: multitask_mlp}\ndata: {}\n";
  expect_valid(head + "comm: {bucket_cap_mb: 0.0008, first_bucket_mb: 0.0004}\n");  // tests/integration
  expect_valid(head + "comm: {bucket_cap_mb: 3.814697265625e-06, first_bucket_mb: 3.814697265625e-06}\n");
  EXPECT_NE(rejection(head + "comm: {first_bucket_mb: 3.8e-06}\n").find("comm.first_bucket_mb: must be at least 4 bytes"),
            std::string::npos);
}

TEST(JobBounds, DeviceSlotsCoverAStep) {
  const std::string model = "steps: 10\nmodel: {kind: multitask_mlp, tasks: 4}\n";
  // Exactly enough slots; offload off; a byte budget (slots depend on group sizes: run decides).
  expect_valid(model + "data: {tasks_per_rank: 3}\noffload: {enabled: true, device_slots: 3}\n");
  expect_valid(model + "data: {tasks_per_rank: 3}\noffload: {enabled: false, device_slots: 1}\n");
  expect_valid(model + "data: {tasks_per_rank: 3}\noffload: {enabled: true, device_slots: 1, device_budget_mb: 64}\n");
  // Capped by the tasks: 3 x 2 micro-steps use at most the 4 tasks.
  expect_valid("accumulate_steps: 2\n" + model + "data: {tasks_per_rank: 3}\noffload: {enabled: true, device_slots: 4}\n");
  // weighted: a task of weight 0 is never drawn.
  expect_valid(model + "data: {schedule: weighted, tasks_per_rank: 4, weights: [1, 1, 0, 0]}\n"
               "offload: {enabled: true, device_slots: 2}\n");
  EXPECT_NE(rejection(model + "data: {schedule: weighted, tasks_per_rank: 4, weights: [1, 1, 1, 0]}\n"
                      "offload: {enabled: true, device_slots: 2}\n")
                .find("at most the tasks of weight > 0 (3)"),
            std::string::npos);
  // per_rank: the same list every micro-step, so accumulation adds no group.
  expect_valid("accumulate_steps: 4\n" + model + "data: {schedule: per_rank, per_rank: [[0, 1], [2, 3]]}\n"
               "offload: {enabled: true, device_slots: 2}\n");
  // alternate: the forward runs every task.
  EXPECT_NE(rejection(model + "data: {schedule: alternate, alternate: [shared, tasks]}\n"
                      "offload: {enabled: true, device_slots: 3}\n")
                .find("offload.device_slots: is 3, fewer than the 4 task groups"),
            std::string::npos);
  // Row-sharded extreme classifier: groups stream their shards (the store checks its 2 slots).
  expect_valid("steps: 10\nmodel: {kind: extreme_classifier, tasks: 4, classes: 400}\ndata: {schedule: all}\n"
               "offload: {enabled: true, device_slots: 2, shard_mb: 1}\n");
}

}  // namespace
}  // namespace thetad::config
