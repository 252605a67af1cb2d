// The fused next-token cross-entropy against LibTorch's cross_entropy on the logits widened to
// float32 (what it replaces): the loss and the gradient that reaches the matmul making the
// logits, for chunks of 1, 3 and all rows, float32 and bf16 logits, a scaled loss, and the one
// tensor it keeps for backward; linear_cross_entropy (the output layer's matmul folded in, for a
// weight that needs no gradient) against the unfused pair; masked targets (data.loss_mask) against
// cross_entropy's ignore_index, and the loss alone when no gradient is wanted (evaluation).
#include <gtest/gtest.h>
#include <torch/torch.h>


#include "daemon/ops/fused_cross_entropy.hpp"
#include "daemon/ops/precision.hpp"

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

// The hidden states' gradient and the loss of logits = h W^T with W frozen: through
// linear_cross_entropy (fused) or the matmul and fused_cross_entropy (the unfused pair), under
// `precision` (bf16: CPU autocast, as the trainer runs forward).
Result run_linear(bool fused, config::Precision precision, int64_t chunk, double scale = 1.0, bool train_w = false) {
  torch::manual_seed(11);
  const torch::Tensor h = torch::randn({kRows, kHidden}).set_requires_grad(true);
  const torch::Tensor w = torch::randn({kClasses, kHidden}).set_requires_grad(train_w);
  const torch::Tensor y = torch::randint(kClasses, {kRows}, torch::kInt64);
  torch::Tensor loss;
  {
    const AutocastScope autocast(precision, torch::Device(torch::kCPU));
    loss = fused ? linear_cross_entropy(h, w, y, chunk) : fused_cross_entropy(torch::matmul(h, w.t()), y, chunk);
  }
  (loss * scale).backward();
  return {loss.detach(), h.grad(), w.grad()};
}

TEST(LinearCrossEntropy, MatchesTheUnfusedPairInFloat32) {
  const Result plain = run_linear(false, config::Precision::Fp32, 0);
  for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(0)}) {
    const Result f = run_linear(true, config::Precision::Fp32, chunk);
    EXPECT_TRUE(torch::allclose(f.loss, plain.loss, 1e-6, 1e-7)) << chunk;
    EXPECT_TRUE(torch::allclose(f.dh, plain.dh, 1e-5, 1e-7)) << chunk;
    EXPECT_FALSE(f.dw.defined());
  }
  const Result scaled = run_linear(true, config::Precision::Fp32, 4, 0.3), plain_scaled = run_linear(false, config::Precision::Fp32, 4, 0.3);
  EXPECT_TRUE(torch::allclose(scaled.dh, plain_scaled.dh, 1e-5, 1e-7));
  EXPECT_FALSE(torch::allclose(scaled.dh, plain.dh, 1e-5, 1e-7));  // the scale reached it
}

TEST(LinearCrossEntropy, MatchesTheUnfusedPairUnderBf16Autocast) {
  const Result plain = run_linear(false, config::Precision::Bf16, 0);
  const Result f = run_linear(true, config::Precision::Bf16, 4);
  EXPECT_EQ(f.dh.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::allclose(f.loss, plain.loss, 1e-6, 1e-7));  // the same bf16 logits
  EXPECT_TRUE(torch::allclose(f.dh, plain.dh, 2e-2, 1e-3));
  // Not the float32 gradient: the matmuls ran in bf16.
  EXPECT_FALSE(torch::allclose(f.dh, run_linear(true, config::Precision::Fp32, 4).dh, 1e-5, 1e-7));
}

TEST(LinearCrossEntropy, AWeightThatNeedsAGradientTakesTheUnfusedPath) {
  const Result plain = run_linear(false, config::Precision::Fp32, 0, 1.0, /*train_w=*/true);
  const Result f = run_linear(true, config::Precision::Fp32, 0, 1.0, /*train_w=*/true);
  ASSERT_TRUE(f.dw.defined());
  EXPECT_TRUE(torch::equal(f.dw, plain.dw));
  EXPECT_TRUE(torch::equal(f.dh, plain.dh));
}

// data.loss_mask: targets of -1 are left out of the loss and its gradient, and the loss is the
// mean over the others: what cross_entropy with ignore_index -1 gives, for the fused loss (a
// trained head) and the linear one (a frozen head), in chunks that split the masked rows.
TEST(MaskedCrossEntropy, MatchesIgnoreIndex) {
  for (bool linear : {false, true}) {
    for (int64_t chunk : {int64_t(1), int64_t(4), int64_t(0)}) {
      torch::manual_seed(11);
      const torch::Tensor h = torch::randn({kRows, kHidden}).set_requires_grad(true);
      const torch::Tensor w = torch::randn({kClasses, kHidden}).set_requires_grad(!linear);
      torch::Tensor y = torch::randint(kClasses, {kRows}, torch::kInt64);
      y.index_put_({torch::tensor({0, 3, 4, 9})}, -1);
      const torch::Tensor ref = torch::nn::functional::cross_entropy(
          torch::matmul(h, w.t()), y, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
      const torch::Tensor dh_ref = torch::autograd::grad({ref}, {h})[0];
      const torch::Tensor loss = linear_cross_entropy(h, w, y, chunk, /*masked=*/true);
      const torch::Tensor dh = torch::autograd::grad({loss * 3.0}, {h})[0] / 3.0;
      EXPECT_TRUE(torch::allclose(loss, ref, 1e-6, 1e-7)) << linear << " " << chunk;
      EXPECT_TRUE(torch::allclose(dh, dh_ref, 1e-5, 1e-7)) << linear << " " << chunk;
      // A masked row gets no gradient at all.
      EXPECT_EQ(dh.index({torch::tensor({0, 3, 4, 9})}).abs().max().item<float>(), 0.0f);
      // No target masked: the unmasked loss (to rounding: a weighted sum where the plain one averages).
      const torch::Tensor all = y.clamp_min(0);
      EXPECT_TRUE(torch::allclose(linear_cross_entropy(h, w, all, chunk, true), linear_cross_entropy(h, w, all, chunk, false),
                                  1e-6, 1e-7));
    }
  }
  // Every target masked: a loss of 0 and no gradient.
  const torch::Tensor h = torch::randn({4, kHidden}).set_requires_grad(true);
  const torch::Tensor w = torch::randn({kClasses, kHidden});
  const torch::Tensor loss = linear_cross_entropy(h, w, torch::full({4}, -1, torch::kInt64), 0, true);
  EXPECT_EQ(loss.item<float>(), 0.0f);
  EXPECT_EQ(torch::autograd::grad({loss}, {h})[0].abs().max().item<float>(), 0.0f);
}

// Without grad mode (evaluation) the loss is computed alone, chunk by chunk: the same value as with
// a gradient, masked or not.
TEST(MaskedCrossEntropy, LossAloneUnderNoGrad) {
  torch::manual_seed(5);
  const torch::Tensor h = torch::randn({kRows, kHidden}).set_requires_grad(true);
  const torch::Tensor w = torch::randn({kClasses, kHidden});
  torch::Tensor y = torch::randint(kClasses, {kRows}, torch::kInt64);
  y.index_put_({torch::tensor({2, 5})}, -1);
  for (bool masked : {false, true}) {
    const torch::Tensor yy = masked ? y : y.clamp_min(0);
    const torch::Tensor with_grad = linear_cross_entropy(h, w, yy, 3, masked).detach();
    torch::NoGradGuard no_grad;
    const torch::Tensor alone = linear_cross_entropy(h, w, yy, 3, masked);
    EXPECT_FALSE(alone.requires_grad());
    EXPECT_TRUE(torch::equal(alone, with_grad)) << masked;
    EXPECT_TRUE(torch::equal(fused_cross_entropy(torch::matmul(h, w.t()), yy, 3, masked),
                             fused_cross_entropy(torch::matmul(h, w.t()), yy, 0, masked)))
        << masked;
  }
}

}  // namespace
}  // namespace thetad::daemon
