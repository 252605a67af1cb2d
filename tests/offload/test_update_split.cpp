// The streamed trunk's balanced split (offload/update_split.hpp): the model's bytes per resource
// and the count that makes PCIe and the CPU AdamW end together.
#include <gtest/gtest.h>

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

// The H100 shape: 12 layers of 6144 x 6144, PCIe ~50 GB/s each way, the CPU AdamW at
// ~107 GB/s: 2 of the 12 layers go to the device, and the longest resource shrinks by 1/6.
TEST(UpdateSplit, BalancesPcieAgainstTheCpu) {
  const std::vector<size_t> layers(12, size_t{6144} * 6144 + 6144);
  const UpdateBandwidths bw{50e9, 50e9, 107e9};
  const size_t k = balanced_split(layers, bw, false);
  EXPECT_GE(k, 2u);
  EXPECT_LE(k, 6u);
  const double none = split_times(layers, 0, bw, false).longest_s(), chosen = split_times(layers, k, bw, false).longest_s();
  EXPECT_LT(chosen, 0.85 * none);  // whole layers: 2 of 12 here (the balance lies between 2 and 3)
  for (size_t other = 0; other <= layers.size(); ++other)
    EXPECT_LE(chosen, split_times(layers, other, bw, false).longest_s()) << other;
}

TEST(UpdateSplit, NoneWhereTheCpuIsFastAndAllWhereItIsSlow) {
  const std::vector<size_t> layers(4, 1 << 20);
  EXPECT_EQ(balanced_split(layers, {50e9, 50e9, 1e15}, false), 0u);  // the CPU costs nothing: keep it there
  EXPECT_EQ(balanced_split(layers, {50e9, 50e9, 1e6}, false), 4u);   // the CPU is the bottleneck at any split
  EXPECT_EQ(balanced_split({}, {50e9, 50e9, 1e9}, false), 0u);
}

}  // namespace
}  // namespace thetad::offload
