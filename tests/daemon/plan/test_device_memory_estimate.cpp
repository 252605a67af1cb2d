// The device memory estimate (daemon/plan/device_memory_estimate.hpp): each term against the
// allocation it stands for, what is created lazily left out, growth with the model, and the
// refusal naming the key and the sizes; the test aid that stands for a GPU's memory.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "common/errors.hpp"
#include "config/loader.hpp"
#include "daemon/plan/device_memory_estimate.hpp"
#include "daemon/plan/memory_estimate.hpp"

namespace thetad::daemon {
namespace {

// Θ: trunk.0 (100 x 1000 + 1000) and trunk.1 (1000 x 1000 + 1000); θ[t]: a head of 1000 x 10 + 10.
// `extra`: more sections; `data` and `model_more` go inside the data and model sections.
config::Job job_of(const std::string& extra, int64_t tasks = 100, int64_t hidden = 1000, const std::string& data = "",
                   const std::string& model_more = "") {
  return config::load_job_from_string("job: m\nsteps: 1\ndata: {" + data + "}\n"
                                      "model: {kind: multitask_mlp, input_dim: 100, hidden: " + std::to_string(hidden) +
                                          ", output_dim: 10, trunk_layers: 2, head_layers: 1, tasks: " +
                                          std::to_string(tasks) + model_more + "}\n" + extra,
                                      "job.yaml");
}

DeviceMemoryNeed need_of(const config::Job& job, int world = 1, int rank = 0) {
  return device_memory_need(job, config::param_counts(job), first_step_groups(job, world, rank));
}

int64_t term(const DeviceMemoryNeed& n, const std::string& starts) {
  for (const DeviceMemoryTerm& t : n.terms)
    if (t.what.rfind(starts, 0) == 0) return t.bytes;
  return 0;
}

constexpr double kShared = 100.0 * 1000 + 1000 + 1000.0 * 1000 + 1000, kTask = 1000.0 * 10 + 10;

TEST(DeviceMemoryEstimate, FirstStepGroupsFollowTheSchedule) {
  const config::Job job = job_of("accumulate_steps: 2\n", 100, 1000, "tasks_per_rank: 3");
  const FirstStepGroups one = first_step_groups(job, 1, 0);
  EXPECT_EQ(one.rank_used, 6);  // round robin: 3 tasks per micro-step, 2 micro-steps, all distinct
  EXPECT_EQ(one.rank_trained_micro, 3);
  EXPECT_EQ(one.any_trained, 6);
  const FirstStepGroups two = first_step_groups(job, 2, 1);
  EXPECT_EQ(two.rank_used, 6);
  EXPECT_EQ(two.any_trained, 12);  // every rank's
}

TEST(DeviceMemoryEstimate, ResidentTermsAreWhatSetUpAndTheFirstStepAllocate) {
  const config::Job job = job_of("", 100, 1000, "tasks_per_rank: 2");
  const DeviceMemoryNeed n = need_of(job, 2, 0);
  ASSERT_TRUE(n.known);
  EXPECT_EQ(term(n, "Θ's values"), int64_t(4 * kShared));
  EXPECT_EQ(term(n, "Θ's gradient buckets"), int64_t(4 * kShared));
  EXPECT_EQ(term(n, "Θ's Adam m and v"), int64_t(8 * kShared));
  EXPECT_EQ(term(n, "the task groups' values"), int64_t(4 * 100 * kTask));
  EXPECT_EQ(term(n, "Adam m and v of the first step's 4 trained"), int64_t(8 * 4 * kTask));  // 2 ranks x 2
  EXPECT_EQ(term(n, "the gradient pool of the first step's 2"), int64_t(4 * 2 * kTask));
  EXPECT_EQ(n.total(), int64_t(16 * kShared + 4 * 100 * kTask + 8 * 4 * kTask + 4 * 2 * kTask));
  EXPECT_EQ(n.key(), "model.hidden");
  EXPECT_NE(n.not_counted.find("activations"), std::string::npos);
  // SGD: no moments.
  const DeviceMemoryNeed sgd = need_of(job_of("optimizer: {kind: sgd}\n"));
  EXPECT_EQ(term(sgd, "Θ's Adam"), 0);
  EXPECT_EQ(sgd.total(), int64_t(8 * kShared + 4 * 100 * kTask + 4 * kTask));
}

TEST(DeviceMemoryEstimate, GrowsWithTasksAndWidth) {
  int64_t last = 0;
  for (int64_t tasks : {10, 100, 1000, 10000}) {
    const int64_t t = need_of(job_of("", tasks)).total();
    EXPECT_GT(t, last) << tasks;
    last = t;
  }
  last = 0;
  for (int64_t hidden : {100, 1000, 4000}) {
    const int64_t t = need_of(job_of("", 100, hidden)).total();
    EXPECT_GT(t, last) << hidden;
    last = t;
  }
  // Many tasks drive the task groups' key.
  EXPECT_EQ(need_of(job_of("", 100000)).key(), "model.tasks");
}

TEST(DeviceMemoryEstimate, Bf16CopiesAndTheFrozenBase) {
  const int64_t fp32 = need_of(job_of("")).total();
  const DeviceMemoryNeed bf16 = need_of(job_of("precision: bf16\n"));
  // Matrices only (biases are not kept for backward): Θ's two layers' 1000 biases, the head's 10.
  EXPECT_EQ(term(bf16, "Θ's bf16 copies"), int64_t(2 * (kShared - 2000)));
  // A head: at least min(hidden, input_dim) = 100 weights per bias, so 100/101 of it (its
  // matrix is 9990 of 10010).
  const int64_t head = term(bf16, "bf16 copies for backward of a micro-step's 1");
  EXPECT_EQ(head, int64_t(2 * std::floor(kTask * 100 / 101)));
  EXPECT_LE(head, 2 * 9990);
  EXPECT_EQ(bf16.total(), fp32 + int64_t(2 * (kShared - 2000)) + head);
  // A frozen base held in bf16: 2 bytes a parameter, no gradient, no moments, no copies.
  const DeviceMemoryNeed frozen = need_of(job_of("precision: bf16\n", 100, 1000, "", ", train_shared: false"));
  EXPECT_EQ(term(frozen, "Θ's values"), int64_t(2 * kShared));
  EXPECT_EQ(term(frozen, "Θ's gradient"), 0);
  EXPECT_EQ(term(frozen, "Θ's Adam"), 0);
  EXPECT_EQ(term(frozen, "Θ's bf16"), 0);
}

TEST(DeviceMemoryEstimate, OffloadCountsSlotsNotTheLazyCache) {
  const DeviceMemoryNeed off = need_of(job_of("offload: {enabled: true, device_slots: 3}\n"));
  EXPECT_EQ(term(off, "the task groups' values"), 0);  // in the host arena
  EXPECT_EQ(term(off, "the task groups' device slots"), int64_t(3 * 4 * kTask));
  EXPECT_EQ(term(off, "the gradient pool"), int64_t(4 * kTask));
  EXPECT_EQ(term(off, "Adam m and v of"), 0);  // cached groups' moments live in the cache's lines
  // The cache: auto is sized after the first step, a size takes as many lines as the device
  // holds; neither is a need.
  const config::Job sized = job_of("offload: {enabled: true, device_slots: 3, device_cache_mb: 500}\n");
  EXPECT_EQ(need_of(sized).total(), off.total());
  EXPECT_NE(off.not_counted.find("offload.device_cache_mb: auto"), std::string::npos);
  // bf16 copies cross into a staging buffer of half a slot each.
  const DeviceMemoryNeed staged =
      need_of(job_of("precision: bf16\noffload: {enabled: true, device_slots: 3, h2d_dtype: bf16}\n"));
  EXPECT_EQ(term(staged, "the task groups' device slots"), int64_t(3 * (4 * kTask + 2 * kTask + 2)));
  // A budget: as many slots as it holds.
  const DeviceMemoryNeed budget = need_of(job_of("offload: {enabled: true, device_budget_mb: 1}\n"));
  EXPECT_EQ(term(budget, "the task groups' device slots"), int64_t(std::floor((1 << 20) / (4 * kTask))) * int64_t(4 * kTask));
  EXPECT_EQ(budget.terms.size(), off.terms.size());
}

TEST(DeviceMemoryEstimate, StreamedTrunk) {
  const double layer = 1000.0 * 1000 + 1000;  // the larger trunk layer
  const std::string base = "offload: {shared: stream, shared_prefetch_layers: 1";
  const DeviceMemoryNeed s = need_of(job_of(base + "}\n"));
  EXPECT_EQ(term(s, "Θ's values"), 0);
  EXPECT_EQ(term(s, "Θ's layer slots"), int64_t(2 * 4 * layer));  // min(prefetch + 2, 2 layers)
  EXPECT_EQ(term(s, "Θ's gradient buckets"), int64_t(4 * kShared));
  EXPECT_EQ(term(s, "Θ's layers kept"), 0);
  EXPECT_EQ(term(s, "the split's update lines"), 0);
  const DeviceMemoryNeed kept = need_of(job_of(base + ", shared_device_layers: 1, shared_split_layers: 1}\n"));
  EXPECT_EQ(term(kept, "Θ's layers kept on the device"), int64_t(12 * layer));
  EXPECT_EQ(term(kept, "the split's update lines"), int64_t(3 * 12 * layer));
  // auto layers: resolved from what is free after set-up, not a need.
  EXPECT_EQ(need_of(job_of(base + ", shared_device_layers: auto}\n")).total(), s.total());
}

TEST(DeviceMemoryEstimate, TransformerIsALowerBoundOfValidationsCount) {
  const config::Job job = config::load_job_from_string(
      "job: t\nsteps: 1\ndata: {}\nmodel: {kind: transformer, arch: llama, layers: 2, d_model: 64, heads: 4, kv_heads: 2, "
      "d_ff: 128, vocab: 100, seq_len: 8, tasks: 3}\nlora: {rank: 4, targets: [q, v]}\n",
      "job.yaml");
  const config::ParamCounts c = config::param_counts(job);
  const DeviceMemoryNeed n = need_of(job);
  const double d = 64, kv = 32, ff = 128, L = 2, V = 100;
  const double shared = 2 * V * d + L * (2 * d * d + 2 * d * kv + 3 * d * ff);
  EXPECT_LE(shared, c.shared);
  EXPECT_EQ(term(n, "Θ's values"), int64_t(4 * shared));
  EXPECT_EQ(term(n, "the task groups' values"), int64_t(4 * 3 * L * 4 * (2 * d + d + kv)));
  EXPECT_EQ(n.key(), "model.d_model");
}

TEST(DeviceMemoryEstimate, TorchScriptIsNotCounted) {
  config::ParamCounts unknown;
  const config::Job job = job_of("");
  const DeviceMemoryNeed n = device_memory_need(job, unknown, FirstStepGroups{});
  EXPECT_FALSE(n.known);
  EXPECT_NO_THROW(check_device_memory(job, n, 0, 0, "cuda:0"));
}

TEST(DeviceMemoryEstimate, RefusesWhatCannotFitNamingKeyAndSizes) {
  const config::Job job = job_of("", 100000);
  const DeviceMemoryNeed n = need_of(job);
  EXPECT_NO_THROW(check_device_memory(job, n, n.total(), n.total(), "cuda:0"));
  try {
    check_device_memory(job, n, n.total() - 1, int64_t(80) << 30, "cuda:0");
    FAIL() << "no refusal";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find("job.yaml: model.tasks: the job needs at least " + format_bytes(double(n.total())) +
                     " of device memory per rank, but cuda:0 has " + format_bytes(double(n.total() - 1)) +
                     " free of 80.00 GiB: Θ's values"),
              0u) << m;
    EXPECT_NE(m.find("the task groups' values (model.tasks = 100000) " + format_bytes(4 * 100000 * kTask)),
              std::string::npos) << m;
    EXPECT_NE(m.find("lower model.tasks, or keep the task groups in the host store (offload.enabled)"),
              std::string::npos) << m;
  }
}

TEST(DeviceMemoryEstimate, TheTestAidStandsForTheDevice) {
  int64_t free_bytes = 0, total = 0;
  std::string where;
  ::unsetenv("THETAD_TEST_DEVICE_MEMORY");
  EXPECT_FALSE(device_memory_for_check(-1, nullptr, 1, &free_bytes, &total, &where));  // a CPU rank
  ::setenv("THETAD_TEST_DEVICE_MEMORY", "1024/81920", 1);
  ASSERT_TRUE(device_memory_for_check(-1, nullptr, 1, &free_bytes, &total, &where));
  EXPECT_EQ(free_bytes, int64_t(1) << 30);
  EXPECT_EQ(total, int64_t(80) << 30);
  EXPECT_NE(where.find("THETAD_TEST_DEVICE_MEMORY"), std::string::npos);
  for (const char* bad : {"1024", "x/1", "2048/1024", "1/2x"}) {
    ::setenv("THETAD_TEST_DEVICE_MEMORY", bad, 1);
    EXPECT_FALSE(device_memory_for_check(-1, nullptr, 1, &free_bytes, &total, &where)) << bad;
  }
  ::unsetenv("THETAD_TEST_DEVICE_MEMORY");
}

}  // namespace
}  // namespace thetad::daemon
