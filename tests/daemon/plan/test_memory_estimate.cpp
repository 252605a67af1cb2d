// The host memory estimate (daemon/plan/memory_estimate.hpp): the parameter counts validation
// finds, the terms per rank and per node, and the refusal naming the key and the sizes.
#include <gtest/gtest.h>

#include <string>

#include "common/errors.hpp"
#include "config/loader.hpp"
#include "daemon/plan/memory_estimate.hpp"

namespace thetad::daemon {
namespace {

config::Job job_of(const std::string& extra) {
  return config::load_job_from_string("job: m\nsteps: 1\ndata: {}\n"
                                      "model: {kind: multitask_mlp, input_dim: 100, hidden: 1000, output_dim: 10, "
                                      "trunk_layers: 1, head_layers: 1, tasks: 1000}\n" + extra,
                                      "job.yaml");
}

TEST(MemoryEstimate, CountsWhatLivesOnTheHost) {
  const config::Job job = job_of("");
  const config::ParamCounts c = config::param_counts(job);
  ASSERT_TRUE(c.known);
  EXPECT_EQ(c.shared, 100.0 * 1000 + 1000);           // trunk.0: weight and bias
  EXPECT_EQ(c.per_task, 1000.0 * 10 + 10);             // one head
  EXPECT_EQ(c.tasks_total, 1000 * c.per_task);
  const HostMemoryNeed cpu = host_memory_need(job, c, 2, /*gpu=*/false);
  EXPECT_EQ(cpu.per_rank_bytes, int64_t(16 * (c.shared + c.tasks_total)));  // Adam: 16 bytes each
  EXPECT_EQ(cpu.node_bytes, 0);
  EXPECT_EQ(cpu.total(), 2 * cpu.per_rank_bytes);
  EXPECT_EQ(cpu.key, "model.tasks");
  EXPECT_EQ(host_memory_need(job, c, 2, /*gpu=*/true).total(), 0);  // all of it on the device
  // Offloaded: one arena per node, whatever the ranks.
  const config::Job off = job_of("offload: {enabled: true, device_budget_mb: 100}\n");
  const HostMemoryNeed node = host_memory_need(off, config::param_counts(off), 4, /*gpu=*/true);
  // The arena's own size (offload::HostArena::required_bytes): 16 bytes a parameter, each group
  // aligned and page-rounded.
  EXPECT_GE(node.node_bytes, int64_t(16 * c.tasks_total));
  EXPECT_LE(node.node_bytes, int64_t(16 * c.tasks_total) + 1000 * 2 * 4096 + 64 * 1000 + 4096);
  const config::Job bf16 = job_of("precision: bf16\noffload: {enabled: true, device_budget_mb: 100, h2d_dtype: bf16}\n");
  EXPECT_GE(host_memory_need(bf16, c, 1, true).node_bytes, int64_t(18 * c.tasks_total));
  EXPECT_EQ(node.total(), node.node_bytes);
}

TEST(MemoryEstimate, RefusesWhatCannotFitNamingKeyAndSizes) {
  const config::Job job = job_of("");
  const HostMemoryNeed need = host_memory_need(job, config::param_counts(job), 2, false);
  EXPECT_NO_THROW(check_host_memory(job, need, need.total(), "this node"));
  EXPECT_NO_THROW(check_host_memory(job, need, -1, "this node"));  // unknown: nothing checked
  try {
    check_host_memory(job, need, need.total() - 1, "this node");
    FAIL() << "no refusal";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("job.yaml: model.tasks: the job needs at least " + format_bytes(double(need.total()))),
              std::string::npos) << m;
    EXPECT_NE(m.find("2 rank(s) x " + format_bytes(double(need.per_rank_bytes))), std::string::npos) << m;
    EXPECT_NE(m.find("MemAvailable"), std::string::npos) << m;
  }
  EXPECT_GT(host_memory_available(), 0);  // Linux has /proc/meminfo
}

TEST(MemoryEstimate, FormatsBytes) {
  EXPECT_EQ(format_bytes(10), "10 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(3.0 * (1 << 30)), "3.00 GiB");
}

}  // namespace
}  // namespace thetad::daemon
