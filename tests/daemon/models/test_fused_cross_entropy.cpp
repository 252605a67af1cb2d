// The fused next-token cross-entropy against LibTorch's cross_entropy on the logits widened to
// float32 (what it replaces): the loss and the gradient that reaches the matmul making the
// logits, for chunks of 1, 3 and all rows, float32 and bf16 logits, a scaled loss, and the one
// tensor it keeps for backward.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "daemon/models/fused_cross_entropy.hpp"

namespace thetad::daemon {
namespace {

constexpr int64_t kRows = 11, kHidden = 6, kClasses = 37;

struct Result {
  torch::Tensor loss, dh, dw;
};

// logits = h W^T in `dtype` (as autocast computes them), then the loss; scaled by `scale`.
Result run(bool fused, torch::ScalarType dtype, int64_t chunk, double scale = 1.0) {
  torch::manual_seed(7);
  const torch::Tensor h = torch::randn({kRows, kHidden}).set_requires_grad(true);
  const torch::Tensor w = torch::randn({kClasses, kHidden}).set_requires_grad(true);
  const torch::Tensor y = torch::randint(kClasses, {kRows}, torch::kInt64);
  const torch::Tensor logits = torch::matmul(h.to(dtype), w.to(dtype).t());
  const torch::Tensor loss = fused ? fused_cross_entropy(logits, y, chunk)
                                   : torch::nn::functional::cross_entropy(logits.to(torch::kFloat32), y);
  (loss * scale).backward();
  return {loss.detach(), h.grad(), w.grad()};
}

TEST(FusedCrossEntropy, MatchesCrossEntropyInFloat32) {
  const Result plain = run(false, torch::kFloat32, 0);
  for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(0)}) {
    const Result f = run(true, torch::kFloat32, chunk);
    EXPECT_TRUE(torch::allclose(f.loss, plain.loss, 1e-6, 1e-7)) << chunk;
    EXPECT_TRUE(torch::allclose(f.dh, plain.dh, 1e-5, 1e-7)) << chunk;
    EXPECT_TRUE(torch::allclose(f.dw, plain.dw, 1e-5, 1e-7)) << chunk;
  }
  // Chunking changes nothing: every row is computed alone.
  EXPECT_TRUE(torch::equal(run(true, torch::kFloat32, 1).dw, run(true, torch::kFloat32, 0).dw));
}

TEST(FusedCrossEntropy, Bf16LogitsGetTheUnfusedGradientToBf16Rounding) {
  const Result plain = run(false, torch::kBFloat16, 0);
  const Result f = run(true, torch::kBFloat16, 4);
  EXPECT_TRUE(torch::allclose(f.loss, plain.loss, 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(f.dh, plain.dh, 2e-2, 1e-3));
  EXPECT_TRUE(torch::allclose(f.dw, plain.dw, 2e-2, 1e-3));
}

TEST(FusedCrossEntropy, ScaledLossScalesTheGradient) {
  const Result one = run(true, torch::kFloat32, 0);
  const Result half = run(true, torch::kFloat32, 0, 0.5);
  EXPECT_TRUE(torch::equal(half.dw, one.dw * 0.5));
  const Result plain = run(false, torch::kFloat32, 0, 0.25);
  EXPECT_TRUE(torch::allclose(run(true, torch::kFloat32, 0, 0.25).dw, plain.dw, 1e-5, 1e-7));
}

TEST(FusedCrossEntropy, KeepsOneTensorOfTheLogitsDtypeForBackward) {
  const torch::Tensor logits = torch::randn({kRows, kClasses}, torch::kBFloat16).set_requires_grad(true);
  const torch::Tensor y = torch::randint(kClasses, {kRows}, torch::kInt64);
  const torch::Tensor loss = fused_cross_entropy(logits, y);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
  loss.backward();
  EXPECT_EQ(logits.grad().scalar_type(), torch::kBFloat16);
  // Each row's gradient sums to zero (softmax minus one-hot), up to bf16 rounding.
  EXPECT_LT(logits.grad().to(torch::kFloat32).sum(1).abs().max().item<float>(), 1e-3f);
}

}  // namespace
}  // namespace thetad::daemon
