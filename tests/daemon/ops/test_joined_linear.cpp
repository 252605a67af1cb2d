// The transformer's joined GEMMs (daemon/ops/joined_linear) and its rotary node
// (daemon/ops/rotary) against the formulas they replace, on the CPU in float32: a frozen base's
// matrices joined and re-pointed, the tasks' adapters joined to match (a target left out
// included), the base and adapter GEMMs as one node, values and gradients; the rotation's three-kernel node against x cos +
// rotate_half(x) sin and its autograd.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <numeric>
#include <string>

#include "daemon/ops/joined_linear.hpp"
#include "daemon/ops/rotary.hpp"

namespace thetad::daemon {
namespace {

TEST(JoinRows, PartsBecomeViewsOfOneMatrixWithTheirValues) {
  torch::manual_seed(1);
  std::vector<torch::Tensor> parts = {torch::randn({6, 4}), torch::randn({2, 4}), torch::randn({2, 4})};
  std::vector<torch::Tensor> before;
  for (const auto& p : parts) before.push_back(p.clone());
  const torch::Tensor handle = parts[1];  // another holder of the same parameter
  const torch::Tensor joined = join_rows(parts);
  ASSERT_TRUE(joined.defined());
  EXPECT_EQ(joined.sizes(), torch::IntArrayRef({10, 4}));
  EXPECT_TRUE(joined_in(joined, parts));
  for (size_t i = 0; i < parts.size(); ++i) EXPECT_TRUE(torch::equal(parts[i], before[i]));
  EXPECT_EQ(handle.data_ptr(), static_cast<float*>(joined.data_ptr()) + 6 * 4);
  // A part re-pointed since (values loaded into the model) is no longer joined.
  parts[2].set_data(torch::zeros({2, 4}));
  EXPECT_FALSE(joined_in(joined, parts));
  EXPECT_FALSE(joined_in(torch::Tensor(), parts));
}

TEST(JoinRows, RefusesWhatCannotBeJoined) {
  EXPECT_FALSE(join_rows({torch::randn({2, 4}), torch::randn({2, 3})}).defined());                          // sizes
  EXPECT_FALSE(join_rows({torch::randn({2, 4}), torch::randn({2, 4}, torch::kFloat64)}).defined());         // dtypes
  EXPECT_FALSE(join_rows({torch::randn({2, 4}), torch::randn({4, 2}).t()}).defined());                      // layout
  EXPECT_FALSE(join_rows({torch::randn({2, 4}), torch::randn({2, 4}).requires_grad_(true)}).defined());     // trained
  EXPECT_FALSE(join_rows({torch::randn({2, 4})}).defined());                                                // one part
}

// x W^T + s (x A_i^T) B_i^T per part i and task, written out; part 1 is not adapted.
TEST(LoraLinear, JoinedAdaptersGiveEachPartAndTaskItsOwnProduct) {
  torch::manual_seed(2);
  const int64_t n = 3, rows = 2, seq = 5, in = 8, r = 2;
  const std::vector<int64_t> outs = {6, 3, 4};
  const double scale = 1.5;
  const torch::Tensor x = torch::randn({n * rows, seq, in});
  const torch::Tensor w = torch::randn({13, in});
  const torch::Tensor y = torch::linear(x, w);
  std::vector<torch::Tensor> as = {torch::randn({n, r, in}).requires_grad_(true), torch::randn({n, r, in}).requires_grad_(true)};
  std::vector<torch::Tensor> bs = {torch::randn({n, 6, r}).requires_grad_(true), torch::Tensor(),
                                   torch::randn({n, 4, r}).requires_grad_(true)};
  const torch::Tensor out =
      lora_linear(x, w, torch::Tensor(), join_lora_a(as), join_lora_b(bs, outs), scale, std::vector<int64_t>(n, rows));
  const torch::Tensor g = torch::randn_like(out);
  (out * g).sum().backward();

  std::vector<torch::Tensor> ra, rb;
  for (const auto& a : as) ra.push_back(a.detach().clone().requires_grad_(true));
  for (const auto& b : bs) rb.push_back(b.defined() ? b.detach().clone().requires_grad_(true) : torch::Tensor());
  std::vector<torch::Tensor> tasks;
  for (int64_t t = 0; t < n; ++t) {
    const torch::Tensor xt = x.narrow(0, t * rows, rows);
    std::vector<torch::Tensor> cols;
    int64_t col = 0, adapted = 0;
    for (size_t i = 0; i < outs.size(); ++i) {
      torch::Tensor yt = y.narrow(0, t * rows, rows).narrow(-1, col, outs[i]);
      col += outs[i];
      if (rb[i].defined()) {
        yt = yt + scale * torch::matmul(torch::matmul(xt, ra[adapted][t].t()), rb[i][t].t());
        ++adapted;
      }
      cols.push_back(yt);
    }
    tasks.push_back(torch::cat(cols, -1));
  }
  const torch::Tensor expected = torch::cat(tasks, 0);
  (expected * g).sum().backward();
  EXPECT_TRUE(torch::allclose(out, expected, 1e-5, 1e-5));
  for (size_t i = 0; i < as.size(); ++i) EXPECT_TRUE(torch::allclose(as[i].grad(), ra[i].grad(), 1e-4, 1e-5)) << "A " << i;
  for (size_t i = 0; i < bs.size(); ++i) {
    if (bs[i].defined()) {
      EXPECT_TRUE(torch::allclose(bs[i].grad(), rb[i].grad(), 1e-4, 1e-5)) << "B " << i;
    }
  }
}

// lora_linear's node against the operators' formula x W^T + bias + s (x A_t^T) B_t^T on task t's
// rows, values and the gradients of all five inputs: with and without a bias, with x taking
// none, and tasks of equal and of unequal rows.
void lora_case(const std::vector<int64_t>& shares, bool with_bias, bool x_grad);

TEST(LoraLinear, TheNodeComputesTheFormulaAndItsGradients) {
  for (const std::vector<int64_t>& shares : {std::vector<int64_t>{2, 2, 2}, std::vector<int64_t>{1, 3, 2}}) {
    for (const bool with_bias : {true, false}) {
      for (const bool x_grad : {true, false}) {
        lora_case(shares, with_bias, x_grad);
      }
    }
  }
}

void lora_case(const std::vector<int64_t>& shares, bool with_bias, bool x_grad) {
  torch::manual_seed(4);
  const int64_t n = 3, in = 8, out = 7, r = 3, seq = 5;
  const double scale = 0.75;
  const int64_t rows = std::accumulate(shares.begin(), shares.end(), int64_t{0});
  const torch::Tensor x = torch::randn({rows, seq, in}).requires_grad_(x_grad);
  const torch::Tensor w = torch::randn({out, in}).requires_grad_(true);
  const torch::Tensor bias = with_bias ? torch::randn({out}).requires_grad_(true) : torch::Tensor();
  const torch::Tensor a = torch::randn({n, r, in}).requires_grad_(true);
  const torch::Tensor b = torch::randn({n, out, r}).requires_grad_(true);
  const torch::Tensor y = lora_linear(x, w, bias, a, b, scale, shares);
  const torch::Tensor g = torch::randn_like(y);
  (y * g).sum().backward();

  const auto copy = [](const torch::Tensor& t) {
    return t.defined() ? t.detach().clone().requires_grad_(t.requires_grad()) : torch::Tensor();
  };
  const torch::Tensor rx = copy(x), rw = copy(w), rbias = copy(bias), ra = copy(a), rb = copy(b);
  std::vector<torch::Tensor> lora;
  for (int64_t t = 0, at = 0; t < n; at += shares[static_cast<size_t>(t)], ++t) {
    const torch::Tensor xt = rx.narrow(0, at, shares[static_cast<size_t>(t)]);
    lora.push_back(torch::matmul(torch::matmul(xt, ra[t].t()), rb[t].t()) * scale);
  }
  const torch::Tensor expected = torch::linear(rx, rw, rbias) + torch::cat(lora);
  (expected * g).sum().backward();
  const std::string what = "shares " + std::to_string(shares[0]) + (with_bias ? ", bias" : "") + (x_grad ? ", dx" : "");
  EXPECT_TRUE(torch::allclose(y, expected, 1e-5, 1e-5)) << what;
  EXPECT_EQ(x.grad().defined(), x_grad) << what;
  if (x_grad) {
    EXPECT_TRUE(torch::allclose(x.grad(), rx.grad(), 1e-4, 1e-5)) << what << ": x";
  }
  EXPECT_TRUE(torch::allclose(w.grad(), rw.grad(), 1e-4, 1e-5)) << what << ": W";
  if (with_bias) {
    EXPECT_TRUE(torch::allclose(bias.grad(), rbias.grad(), 1e-4, 1e-5)) << what << ": bias";
  }
  EXPECT_TRUE(torch::allclose(a.grad(), ra.grad(), 1e-4, 1e-5)) << what << ": A";
  EXPECT_TRUE(torch::allclose(b.grad(), rb.grad(), 1e-4, 1e-5)) << what << ": B";
}

TEST(Rotary, TheNodeComputesTheFormulaAndItsGradient) {
  torch::manual_seed(3);
  config::ModelConfig m;
  m.d_model = 32;
  m.heads = 4;
  m.seq_len = 7;
  m.rope_theta = 10000.0;
  const RotaryTables tables(m, torch::kCPU);
  // A strided view, as the joined q/k/v GEMM's output gives it: [rows, heads, seq, head size].
  const torch::Tensor qkv = torch::randn({2, 7, 3 * 32});
  const torch::Tensor x = qkv.narrow(-1, 0, 32).view({2, 7, 4, 8}).transpose(1, 2).detach().requires_grad_(true);
  const torch::Tensor out = tables.rotate(x);
  const torch::Tensor g = torch::randn_like(out);
  (out * g).sum().backward();

  const torch::Tensor x2 = x.detach().clone().requires_grad_(true);
  const torch::Tensor c = tables.cos.narrow(0, 0, 7), s = tables.sin.narrow(0, 0, 7);
  const torch::Tensor rot = torch::cat({-x2.narrow(-1, 4, 4), x2.narrow(-1, 0, 4)}, -1);
  const torch::Tensor expected = x2 * c + rot * s;
  (expected * g).sum().backward();
  EXPECT_TRUE(torch::allclose(out, expected, 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(x.grad(), x2.grad(), 1e-6, 1e-6));
}

}  // namespace
}  // namespace thetad::daemon
