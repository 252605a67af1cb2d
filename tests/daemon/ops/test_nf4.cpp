// 4-bit NormalFloat (daemon/ops/nf4) against QLoRA's definition written out here: the code book
// from the normal distribution's quantiles, blocks of 64 scaled by their absmax (held in bf16, the
// format's one difference from QLoRA's), each value given its nearest level; the dequantized values
// as code * absmax rounded once to bf16; and the base
// GEMMs over a quantized matrix (lora_linear, quantized_linear) giving the bits, values and
// gradients, of the same GEMMs over its dequantized values, with the scratch overwritten between
// forward and backward.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "daemon/ops/joined_linear.hpp"
#include "daemon/ops/nf4.hpp"

namespace thetad::daemon {
namespace {

// The standard normal distribution's quantile function, by bisection of its CDF.
double normal_quantile(double p) {
  double lo = -40, hi = 40;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

// QLoRA's construction: 8 quantiles of the positive half at probabilities evenly spaced from
// offset = (1 - 1 / (2 * 15) + 1 - 1 / (2 * 16)) / 2 down to 1/2 (without the last), 7 of the
// negative half likewise, and 0; normalised by the largest. The probabilities as float32, as the
// reference implementation computes them.
std::vector<float> code_book_by_definition() {
  const double offset = 0.9677083;
  std::vector<float> v;
  const torch::Tensor pos = torch::linspace(offset, 0.5, 9), neg = torch::linspace(offset, 0.5, 8);
  for (int i = 0; i < 8; ++i) v.push_back(static_cast<float>(normal_quantile(pos[i].item<float>())));
  for (int i = 0; i < 7; ++i) v.push_back(static_cast<float>(-normal_quantile(neg[i].item<float>())));
  v.push_back(0.0f);
  std::sort(v.begin(), v.end());
  const float top = v.back();
  for (float& x : v) x /= top;
  return v;
}

// x rounded to the nearest bf16 (ties to even), by its bits: the upper 16 of float32's.
float round_to_bf16(float x) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  float out = 0;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// Codes and absmax of w by the definition: each block of 64 consecutive values (zeros padding
// the last), its absmax rounded to bf16, x / absmax, the index of the nearest level (the first of
// two equally near).
std::pair<std::vector<uint8_t>, std::vector<float>> quantize_by_definition(const torch::Tensor& w) {
  const std::vector<float> book = code_book_by_definition();
  const torch::Tensor flat = w.to(torch::kFloat32).reshape({-1}).contiguous();
  const int64_t n = flat.numel(), blocks = (n + 63) / 64;
  std::vector<float> v(flat.data_ptr<float>(), flat.data_ptr<float>() + n);
  v.resize(static_cast<size_t>(blocks * 64), 0.0f);
  std::vector<uint8_t> codes(static_cast<size_t>(blocks * 32), 0);
  std::vector<float> absmax;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    float m = 0;
    for (int64_t e = blk * 64; e < (blk + 1) * 64; ++e) m = std::max(m, std::fabs(v[static_cast<size_t>(e)]));
    m = round_to_bf16(m);
    absmax.push_back(m);
    for (int64_t e = blk * 64; e < (blk + 1) * 64; ++e) {
      const float x = m > 0 ? v[static_cast<size_t>(e)] / m : 0.0f;
      int best = 0;
      for (int c = 1; c < 16; ++c)
        if (std::fabs(x - book[static_cast<size_t>(c)]) < std::fabs(x - book[static_cast<size_t>(best)])) best = c;
      codes[static_cast<size_t>(e / 2)] |= static_cast<uint8_t>(e % 2 == 0 ? best << 4 : best);
    }
  }
  return {codes, absmax};
}

TEST(Nf4, CodeBookIsQloraDefinition) {
  const std::vector<float> book = code_book_by_definition();
  for (size_t c = 0; c < 16; ++c) EXPECT_NEAR(nf4_code_book()[c], book[c], 1e-7) << "level " << c;
  EXPECT_EQ(nf4_code_book()[7], 0.0f);
  EXPECT_EQ(nf4_code_book().front(), -1.0f);
  EXPECT_EQ(nf4_code_book().back(), 1.0f);
}

TEST(Nf4, QuantizerMatchesDefinitionWithPartialLastBlockAndZeroBlock) {
  torch::manual_seed(3);
  torch::Tensor w = torch::randn({37, 70});  // 2,590 values: 40 whole blocks and 30 values
  w.view({-1}).narrow(0, 128, 64).zero_();   // a block of zeros stays zero
  for (const torch::ScalarType dt : {torch::kFloat32, torch::kBFloat16}) {
    const torch::Tensor wd = w.to(dt);
    const Nf4Matrix q = nf4_quantize(wd);
    const auto [codes, absmax] = quantize_by_definition(wd);
    ASSERT_EQ(q.rows, 37);
    ASSERT_EQ(q.cols, 70);
    ASSERT_EQ(q.codes.numel(), static_cast<int64_t>(codes.size()));
    ASSERT_EQ(q.absmax.numel(), static_cast<int64_t>(absmax.size()));
    EXPECT_TRUE(std::equal(codes.begin(), codes.end(), q.codes.data_ptr<uint8_t>()));
    ASSERT_EQ(q.absmax.scalar_type(), torch::kBFloat16);
    const torch::Tensor held = q.absmax.to(torch::kFloat32);
    EXPECT_TRUE(std::equal(absmax.begin(), absmax.end(), held.data_ptr<float>()));
    EXPECT_EQ(q.bytes(), 41 * 32 + 41 * 2);
  }
}

TEST(Nf4, DequantizedIsLevelTimesAbsmaxRoundedOnceToBf16) {
  torch::manual_seed(4);
  const torch::Tensor w = torch::randn({24, 40}) * 3;
  const Nf4Matrix q = nf4_quantize(w);
  const auto [codes, absmax] = quantize_by_definition(w);
  const std::vector<float> book = code_book_by_definition();
  std::vector<float> expect;
  for (int64_t e = 0; e < w.numel(); ++e) {
    const uint8_t byte = codes[static_cast<size_t>(e / 2)];
    const int c = e % 2 == 0 ? byte >> 4 : byte & 15;
    expect.push_back(book[static_cast<size_t>(c)] * absmax[static_cast<size_t>(e / 64)]);
  }
  const torch::Tensor want = torch::tensor(expect).to(torch::kBFloat16).view({24, 40});
  const torch::Tensor bf16 = nf4_dequantize(q, torch::kBFloat16);
  EXPECT_TRUE(torch::equal(bf16, want));
  EXPECT_TRUE(torch::equal(nf4_dequantize(q, torch::kFloat32), want.to(torch::kFloat32)));
  // Into the scratch's memory where it is large enough; new memory where it is not.
  const torch::Tensor scratch = torch::full({2000}, 7.0f);
  const torch::Tensor in_scratch = nf4_dequantize(q, torch::kFloat32, scratch);
  EXPECT_EQ(in_scratch.data_ptr(), scratch.data_ptr());
  EXPECT_TRUE(torch::equal(in_scratch, want.to(torch::kFloat32)));
  EXPECT_EQ(scratch[1999].item<float>(), 7.0f);
  EXPECT_NE(nf4_dequantize(q, torch::kFloat32, torch::zeros({10})).data_ptr(), scratch.data_ptr());
  // The error of 4 bits: within half the widest gap between levels times the absmax.
  EXPECT_LT((bf16.to(torch::kFloat32) - w).abs().max().item<float>(), 0.5f * (1.0f - 0.7229568f) * w.abs().max().item<float>());
}

// The scratch written over between forward and backward (another layer's matrix): backward
// dequantizes again and gets the same gradients as over the dequantized values kept whole.
TEST(Nf4, GemmsOverQuantizedBaseEqualThoseOverItsValues) {
  torch::manual_seed(5);
  const int64_t tasks = 2, rows = 3, seq = 4, in = 64, out = 48, r = 4;
  const Nf4Matrix q = nf4_quantize(torch::randn({out, in}));
  const Nf4Matrix other = nf4_quantize(torch::randn({out, in}));
  const torch::Tensor w = nf4_dequantize(q, torch::kFloat32);
  Nf4Weights weights;
  weights.add(0, q);
  weights.add(1, other);
  const FrozenWeight qw{&weights, 0};
  const auto inputs = [&] {
    torch::manual_seed(6);
    return std::vector<torch::Tensor>{torch::randn({tasks * rows, seq, in}).requires_grad_(true),
                                      torch::randn({tasks, r, in}).requires_grad_(true),
                                      torch::randn({tasks, out, r}).requires_grad_(true), torch::randn({out})};
  };
  const std::vector<int64_t> shares(tasks, rows);
  const auto grads = [&](bool quantized, bool adapters) {
    std::vector<torch::Tensor> v = inputs();
    const torch::Tensor bias = v[3];
    torch::Tensor y;
    if (adapters)
      y = quantized ? lora_linear(v[0], qw, bias, v[1], v[2], 0.5, shares) : lora_linear(v[0], w, bias, v[1], v[2], 0.5, shares);
    else
      y = quantized ? frozen_linear(v[0], qw, bias) : torch::linear(v[0], w, bias);
    if (quantized) weights.acquire(1, torch::kFloat32, false);  // another layer's matrix in the scratch
    (y * torch::linspace(-1, 1, y.numel()).view(y.sizes())).sum().backward();
    std::vector<torch::Tensor> out = {y.detach(), v[0].grad()};
    if (adapters) out.insert(out.end(), {v[1].grad(), v[2].grad()});
    return out;
  };
  for (bool adapters : {true, false}) {
    const std::vector<torch::Tensor> a = grads(true, adapters), b = grads(false, adapters);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "adapters " << adapters << ", tensor " << i;
  }
}

}  // namespace
}  // namespace thetad::daemon
