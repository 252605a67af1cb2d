// CPU Adam/AdamW against LibTorch's torch::optim::AdamW and Adam: parameters and both moments
// after several steps, odd sizes (tails of every vector width), with and without weight decay.
// The only LibTorch translation unit of the offload tests.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "offload/cpu_adam.hpp"

using thetad::offload::AdamHyper;

namespace {

struct Case {
  bool decoupled;
  double wd;
};

// Max over elements of |a-b| / max(|b|, floor): relative error, with a floor for values near 0.
double max_rel(const torch::Tensor& a, const torch::Tensor& b, double floor) {
  auto d = (a - b).abs() / b.abs().clamp_min(floor);
  return d.max().item<double>();
}

template <typename Opt, typename OptOptions, typename State>
void run(size_t n, const Case& c, int steps) {
  torch::manual_seed(static_cast<uint64_t>(n) * 31 + (c.decoupled ? 1 : 0) + (c.wd > 0 ? 2 : 0));
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  auto init = torch::randn({static_cast<int64_t>(n)});
  auto tp = init.clone().set_requires_grad(true);
  std::vector<float> p(init.data_ptr<float>(), init.data_ptr<float>() + n), m(n, 0.f), v(n, 0.f);

  OptOptions opts(lr);
  opts.betas(std::make_tuple(b1, b2)).eps(eps).weight_decay(c.wd);
  Opt opt({tp}, opts);
  for (int t = 1; t <= steps; ++t) {
    auto g = torch::randn({static_cast<int64_t>(n)});
    tp.mutable_grad() = g.clone();
    opt.step();
    AdamHyper h;
    h.lr = lr;
    h.beta1 = b1;
    h.beta2 = b2;
    h.eps = eps;
    h.weight_decay = c.wd;
    h.decoupled = c.decoupled;
    h.step = t;
    thetad::offload::adam_step(p.data(), g.data_ptr<float>(), m.data(), v.data(), n, h);
  }
  // One parameter, one state entry (its key type differs between LibTorch versions).
  ASSERT_EQ(opt.state().size(), 1u);
  auto& st = static_cast<State&>(*opt.state().begin()->second);
  auto ours = [&](std::vector<float>& x) {
    return torch::from_blob(x.data(), {static_cast<int64_t>(n)}, torch::kFloat32);
  };
  const auto what = std::string(c.decoupled ? "AdamW" : "Adam") + " n=" + std::to_string(n) +
                    " wd=" + std::to_string(c.wd);
  torch::NoGradGuard ng;
  EXPECT_LE(max_rel(ours(p), tp.detach(), 1e-2), 1e-6) << what << " params";
  EXPECT_LE(max_rel(ours(m), st.exp_avg(), 1e-3), 1e-6) << what << " exp_avg";
  EXPECT_LE(max_rel(ours(v), st.exp_avg_sq(), 1e-6), 1e-6) << what << " exp_avg_sq";
}

}  // namespace

class CpuAdamVsTorch : public ::testing::TestWithParam<size_t> {};

TEST_P(CpuAdamVsTorch, AdamW) {
  for (double wd : {0.0, 0.01, 0.1})
    run<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>(GetParam(), {true, wd}, 6);
}

TEST_P(CpuAdamVsTorch, Adam) {
  for (double wd : {0.0, 0.01, 0.1})
    run<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>(GetParam(), {false, wd}, 6);
}

INSTANTIATE_TEST_SUITE_P(OddSizes, CpuAdamVsTorch,
                         ::testing::Values(1, 7, 15, 16, 17, 31, 33, 1000, 65537, 1000003));
