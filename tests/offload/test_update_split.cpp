// The streamed trunk's split (offload/update_split.hpp): the resources' byte totals, and the step
// model against the steps measured on an H100 (docs/BENCHMARKS.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "offload/update_split.hpp"

namespace thetad::offload {
namespace {

TEST(UpdateSplit, TimesFollowTheBytesPerParameter) {
  const std::vector<size_t> layers{1000, 1000};
  const UpdateBandwidths bw{1.0, 1.0, 1.0};  // bytes per second: the times are bytes
  const SplitTimes none = split_times(layers, 0, bw, false);
  EXPECT_DOUBLE_EQ(none.h2d_s, 2 * 8 * 1000.0);   // values forward and backward
  EXPECT_DOUBLE_EQ(none.d2h_s, 2 * 4 * 1000.0);   // gradients
  EXPECT_DOUBLE_EQ(none.cpu_s, 2 * 28 * 1000.0);  // p, g, m, v read; p, m, v written
  const SplitTimes one = split_times(layers, 1, bw, false);
  EXPECT_DOUBLE_EQ(one.h2d_s, 16000.0 + 12000.0);
  EXPECT_DOUBLE_EQ(one.d2h_s, 4000.0 + 12000.0);
  EXPECT_DOUBLE_EQ(one.cpu_s, 28000.0);
  const SplitTimes bf16 = split_times(layers, 0, bw, true);
  EXPECT_DOUBLE_EQ(bf16.h2d_s, 2 * 4 * 1000.0);
  EXPECT_DOUBLE_EQ(bf16.cpu_s, 2 * 30 * 1000.0);
}

// The benchmark's trunks: `layers` layers of width x width plus a bias, batch 1024 in fp32 with
// activations offloaded (x and z of each layer: 2 x 1024 x width x 4 bytes), the all-resident
// step's compute spread evenly over the layers at forward : backward = 1 : 2, the bandwidths the
// probe measured on that host.
StepInput bench_trunk(size_t width, size_t layers, double resident_s) {
  StepInput in;
  in.bw = {54.8e9, 54.3e9, 159e9};
  in.device_adam_bps = 2e12;  // HBM: the device AdamW's 28 B per parameter
  for (size_t l = 0; l < layers; ++l) {
    LayerCost c;
    c.numel = width * width + width;
    c.fwd_s = resident_s / static_cast<double>(layers) / 3;
    c.bwd_s = 2 * c.fwd_s;
    c.act_bytes = 2.0 * 1024 * static_cast<double>(width) * 4;
    in.layers.push_back(c);
  }
  return in;
}

struct Measured {
  size_t width, layers;
  double resident_ms, none_ms, all_ms;
};

// One H100, tree 6e79bfa: no split, every streamed layer split, all-resident (compute only).
const Measured kMeasured[] = {{6144, 12, 69.1, 141.5, 204.7}, {4096, 24, 57.2, 116.6, 190.0}, {8192, 8, 78.8, 170.0, 254.6}};

TEST(UpdateSplit, ModelReproducesTheMeasuredSteps) {
  for (const Measured& m : kMeasured) {
    SCOPED_TRACE(std::to_string(m.width) + " x " + std::to_string(m.layers));
    const StepInput in = bench_trunk(m.width, m.layers, m.resident_ms / 1e3);
    std::vector<StepModel> models;
    const size_t k = fastest_split(in, &models);
    ASSERT_EQ(models.size(), m.layers + 1);
    const double none = models.front().step_s * 1e3, all = models.back().step_s * 1e3, chosen = models[k].step_s * 1e3;
    EXPECT_NEAR(none, m.none_ms, 0.15 * m.none_ms);
    EXPECT_NEAR(all, m.all_ms, 0.15 * m.all_ms);
    // As measured: the best count within a few % of none, every layer split far behind both;
    // a gain that small is inside the model's error (kSplitMargin), so none is chosen.
    EXPECT_EQ(k, 0u);
    EXPECT_NEAR(std::min_element(models.begin(), models.end(), [](const StepModel& a, const StepModel& b) {
                  return a.step_s < b.step_s;
                })->step_s * 1e3, none, 0.10 * none);
    EXPECT_NEAR(chosen, none, 0.05 * none);
    EXPECT_GT(all, 1.3 * chosen);
    // The old totals' floor (the longest resource alone) is far below what the step takes.
    std::vector<size_t> numel(m.layers, m.width * m.width + m.width);
    EXPECT_LT(split_times(numel, 0, in.bw, false).longest_s() * 1e3, 0.7 * m.none_ms);
  }
}

// StreamedTrunk estimates the compute from FLOPs at a fixed rate: a rate 4x off either way picks
// a count whose step (under the true compute) is no slower than none and within 5% of the best
// (the whole gain on offer on these shapes is ~3%).
TEST(UpdateSplit, CountIsRobustToTheComputeEstimate) {
  for (const Measured& m : kMeasured) {
    SCOPED_TRACE(std::to_string(m.width) + " x " + std::to_string(m.layers));
    std::vector<StepModel> truth;
    const size_t best = fastest_split(bench_trunk(m.width, m.layers, m.resident_ms / 1e3), &truth);
    for (double off : {0.25, 4.0}) {
      const size_t k = fastest_split(bench_trunk(m.width, m.layers, off * m.resident_ms / 1e3));
      EXPECT_LT(truth[k].step_s, 1.05 * truth[best].step_s) << off;
      EXPECT_LE(truth[k].step_s, truth.front().step_s * (1 + 1e-9)) << off;
    }
  }
}

// A steady step cannot be shorter than any one resource's work in it, nor than the compute.
TEST(UpdateSplit, StepIsAtLeastEachResourcesWork) {
  const StepInput in = bench_trunk(4096, 6, 0.03);
  double compute = 0;
  for (const LayerCost& c : in.layers) compute += c.fwd_s + c.bwd_s;
  for (size_t k = 0; k <= in.layers.size(); ++k) {
    const StepModel m = model_step(in, k);
    SCOPED_TRACE(k);
    EXPECT_GE(m.compute_s, compute * (1 - 1e-9));
    for (double busy : {m.compute_s, m.h2d_s, m.d2h_s, m.cpu_s}) EXPECT_LE(busy, m.step_s * (1 + 1e-9));
    EXPECT_EQ(m.cpu_s > 0, k < in.layers.size());  // split layers give the CPU nothing to do
  }
}

TEST(UpdateSplit, NoneWhereTheCpuIsFastAndAllWhereItIsSlow) {
  StepInput in = bench_trunk(2048, 4, 0.02);
  in.bw.cpu_adam = 1e15;  // the CPU costs nothing: keep its layers there
  EXPECT_EQ(fastest_split(in), 0u);
  in.bw.cpu_adam = 1e8;   // the CPU is the bottleneck at any split
  EXPECT_EQ(fastest_split(in), 4u);
  EXPECT_EQ(fastest_split(StepInput{}), 0u);
  EXPECT_GT(model_step(in, 0).step_s, 10 * model_step(in, 4).step_s);
}

// Compute and copies that the PCIe and the CPU never wait on: the step is the compute.
TEST(UpdateSplit, FreeTransfersLeaveTheCompute) {
  StepInput in = bench_trunk(1024, 5, 0.01);
  in.bw = {1e18, 1e18, 1e18};
  in.before_s = 0.002;
  in.after_s = 0.003;
  EXPECT_NEAR(model_step(in, 0).step_s, 0.015, 1e-6);
  EXPECT_NEAR(model_step(in, 5).step_s, 0.015, 1e-4);  // plus the device AdamW's 15 us a layer
}

// bf16 copies halve the values' bytes in; the CPU AdamW writes 2 B more per parameter.
TEST(UpdateSplit, Bf16CopiesMoveHalfTheValues) {
  StepInput in = bench_trunk(4096, 8, 0.04);
  for (LayerCost& c : in.layers) c.act_bytes = 0;
  const StepModel fp32 = model_step(in, 0);
  in.bf16_copies = true;
  const StepModel bf16 = model_step(in, 0);
  EXPECT_LT(bf16.h2d_s, 0.6 * fp32.h2d_s);
  EXPECT_GT(bf16.cpu_s, fp32.cpu_s);
}

}  // namespace
}  // namespace thetad::offload
