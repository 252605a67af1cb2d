// trunk_layer against LibTorch's autograd of gelu(addmm(b, x, W^T)) on the CPU: the same bits in
// every gradient (weights, biases, the input), over several layers and random shapes, with a layer
// used twice in one backward (several tasks per step), frozen layers, bf16 autocast, weights from
// a LayerWeights provider and saved tensors in an ActivationStash.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <set>

#include "daemon/ops/precision.hpp"
#include "daemon/ops/trunk_layer.hpp"

namespace thetad::daemon {
namespace {

struct Net {
  std::vector<torch::Tensor> W, b;
};

Net make_net(const std::vector<int64_t>& dims, uint64_t seed) {
  torch::manual_seed(seed);
  Net n;
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    n.W.push_back(torch::randn({dims[i + 1], dims[i]}).set_requires_grad(true));
    n.b.push_back(torch::randn({dims[i + 1]}).set_requires_grad(true));
  }
  return n;
}

Net clone(const Net& n) {
  Net c;
  for (const auto& w : n.W) c.W.push_back(w.detach().clone().set_requires_grad(w.requires_grad()));
  for (const auto& b : n.b) c.b.push_back(b.detach().clone().set_requires_grad(b.requires_grad()));
  return c;
}

// The last layer has no activation, as a trunk followed by a head would.
TrunkAct act_of(size_t i, size_t layers) { return i + 1 == layers ? TrunkAct::none : TrunkAct::gelu; }

torch::Tensor reference_forward(const Net& n, torch::Tensor h) {
  for (size_t i = 0; i < n.W.size(); ++i) {
    h = torch::addmm(n.b[i], h, n.W[i].t());
    if (act_of(i, n.W.size()) == TrunkAct::gelu) h = torch::gelu(h);
  }
  return h;
}

torch::Tensor trunk_forward(const Net& n, torch::Tensor h, LayerWeights* weights = nullptr,
                            ActivationStash* stash = nullptr) {
  for (size_t i = 0; i < n.W.size(); ++i)
    h = trunk_layer(h, n.W[i], n.b[i], act_of(i, n.W.size()), int(i), weights, stash);
  return h;
}

// A stash that keeps copies on the side, checking tickets come back once each.
class CopyStash : public ActivationStash {
 public:
  int64_t put(int layer, std::vector<torch::Tensor> saved) override {
    (void)layer;
    for (auto& t : saved) t = t.clone();
    kept_[next_] = std::move(saved);
    return next_++;
  }
  std::vector<torch::Tensor> take(int64_t ticket) override {
    auto it = kept_.find(ticket);
    EXPECT_NE(it, kept_.end()) << "ticket " << ticket;
    auto v = std::move(it->second);
    kept_.erase(it);
    ++taken_;
    return v;
  }
  size_t pending() const { return kept_.size(); }
  int taken_ = 0;

 private:
  std::map<int64_t, std::vector<torch::Tensor>> kept_;
  int64_t next_ = 0;
};

// Weights from ordinary tensors (not leaves); gradients summed as the provider's own.
class PlainWeights : public LayerWeights {
 public:
  explicit PlainWeights(const Net& n, bool trained = true) : trained_(trained) {
    for (size_t i = 0; i < n.W.size(); ++i) {
      W.push_back(n.W[i].detach().clone());
      b.push_back(n.b[i].detach().clone());
      dW.emplace_back();
      db.emplace_back();
    }
  }
  std::pair<torch::Tensor, torch::Tensor> acquire(int layer, bool backward) override {
    EXPECT_FALSE(held_.count(layer)) << "layer " << layer << " acquired twice";
    held_.insert(layer);
    (backward ? bwd_order : fwd_order).push_back(layer);
    return {W[layer], b[layer]};
  }
  void release(int layer) override {
    EXPECT_TRUE(held_.count(layer)) << "layer " << layer << " released but not held";
    held_.erase(layer);
  }
  void grad(int layer, const torch::Tensor& gW, const torch::Tensor& gb) override {
    dW[layer] = dW[layer].defined() ? dW[layer] + gW : gW.clone();
    db[layer] = db[layer].defined() ? db[layer] + gb : gb.clone();
  }
  bool wants_grad(int) override { return trained_; }
  std::vector<torch::Tensor> W, b, dW, db;
  std::vector<int> fwd_order, bwd_order;
  std::set<int> held_;

 private:
  bool trained_;
};

void expect_same(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (!a.defined()) return;
  EXPECT_EQ(a.scalar_type(), b.scalar_type()) << what;
  EXPECT_TRUE(torch::equal(a, b)) << what << ": max |diff| " << (a - b).abs().max().item<double>();
}

void expect_same_grads(const Net& ref, const Net& got) {
  for (size_t i = 0; i < ref.W.size(); ++i) {
    expect_same(ref.W[i].grad(), got.W[i].grad(), "W" + std::to_string(i) + ".grad");
    expect_same(ref.b[i].grad(), got.b[i].grad(), "b" + std::to_string(i) + ".grad");
  }
}

// Two "tasks" through the same layers, one backward of the summed loss (as the trainer does).
void run_two_tasks(const Net& n, const torch::Tensor& x1, const torch::Tensor& x2, bool trunk,
                   LayerWeights* weights = nullptr, ActivationStash* stash = nullptr,
                   config::Precision precision = config::Precision::Fp32) {
  torch::Tensor loss;
  {
    const AutocastScope autocast(precision, torch::Device(torch::kCPU));
    auto f = [&](const torch::Tensor& x) {
      return trunk ? trunk_forward(n, x, weights, stash) : reference_forward(n, x);
    };
    torch::Tensor y1 = f(x1), y2 = f(x2);
    torch::manual_seed(99);
    loss = (y1.to(torch::kFloat32) * torch::randn(y1.sizes())).sum() +
           (y2.to(torch::kFloat32) * torch::randn(y2.sizes())).sum() * 0.5;
  }
  loss.backward();
}

TEST(TrunkLayer, GradientsHaveAutogradsBitsOverRandomShapes) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    torch::manual_seed(seed * 7919);
    const int64_t layers = 1 + torch::randint(4, {1}).item<int64_t>();
    std::vector<int64_t> dims{1 + torch::randint(40, {1}).item<int64_t>()};
    for (int64_t l = 0; l < layers; ++l) dims.push_back(1 + torch::randint(70, {1}).item<int64_t>());
    const int64_t rows = 1 + torch::randint(33, {1}).item<int64_t>();
    Net ref = make_net(dims, seed), got = clone(ref);
    // The second input needs a gradient (a layer past the first): the input gradient is checked too.
    torch::Tensor x1 = torch::randn({rows, dims[0]});
    torch::Tensor x2r = torch::randn({rows + 3, dims[0]}).set_requires_grad(true);
    torch::Tensor x2g = x2r.detach().clone().set_requires_grad(true);
    run_two_tasks(ref, x1, x2r, false);
    run_two_tasks(got, x1, x2g, true);
    SCOPED_TRACE("seed " + std::to_string(seed));
    expect_same_grads(ref, got);
    expect_same(x2r.grad(), x2g.grad(), "x.grad");
  }
}

TEST(TrunkLayer, ForwardHasAddmmsBits) {
  Net n = make_net({17, 31, 9}, 3);
  torch::Tensor x = torch::randn({12, 17});
  expect_same(reference_forward(n, x), trunk_forward(n, x), "forward");
  torch::NoGradGuard no_grad;
  expect_same(reference_forward(n, x), trunk_forward(n, x), "forward without grad");
}

TEST(TrunkLayer, FrozenLayersGetNoGradientAndTheRestMatch) {
  Net ref = make_net({9, 23, 23, 5}, 4);
  ref.W[0].requires_grad_(false);
  ref.b[0].requires_grad_(false);
  ref.b[2].requires_grad_(false);
  Net got = clone(ref);
  torch::Tensor x1 = torch::randn({6, 9}), x2 = torch::randn({4, 9});
  run_two_tasks(ref, x1, x2, false);
  run_two_tasks(got, x1, x2, true);
  expect_same_grads(ref, got);
  EXPECT_FALSE(got.W[0].grad().defined());
}

TEST(TrunkLayer, Bf16AutocastHasAutogradsBits) {
  Net ref = make_net({24, 40, 40, 16}, 5), got = clone(ref);
  torch::Tensor x1 = torch::randn({10, 24}), x2 = torch::randn({7, 24});
  run_two_tasks(ref, x1, x2, false, nullptr, nullptr, config::Precision::Bf16);
  run_two_tasks(got, x1, x2, true, nullptr, nullptr, config::Precision::Bf16);
  expect_same_grads(ref, got);
  EXPECT_EQ(got.W[0].grad().scalar_type(), torch::kFloat32);
}

TEST(TrunkLayer, StashedActivationsGiveTheSameBits) {
  for (auto precision : {config::Precision::Fp32, config::Precision::Bf16}) {
    Net ref = make_net({13, 29, 29, 29, 7}, 6), got = clone(ref);
    torch::Tensor x1 = torch::randn({11, 13}), x2 = torch::randn({5, 13});
    CopyStash stash;
    run_two_tasks(ref, x1, x2, false, nullptr, nullptr, precision);
    run_two_tasks(got, x1, x2, true, nullptr, &stash, precision);
    expect_same_grads(ref, got);
    EXPECT_EQ(stash.taken_, 8);  // 4 layers x 2 tasks
    EXPECT_EQ(stash.pending(), 0u);
  }
}

// Under bf16 autocast a provider gets each use's db widened to float32: the same bits as
// autograd's only with one use per backward (autograd sums the cached bias cast's uses in bf16).
TEST(TrunkLayer, WeightsFromAProviderGiveTheSameBits) {
  for (auto precision : {config::Precision::Fp32}) {
    Net ref = make_net({13, 29, 29, 7}, 7);
    Net leaves = clone(ref);
    PlainWeights weights(ref);
    torch::Tensor x1 = torch::randn({11, 13}), x2 = torch::randn({5, 13});
    CopyStash stash;
    run_two_tasks(ref, x1, x2, false, nullptr, nullptr, precision);
    run_two_tasks(leaves, x1, x2, true, &weights, &stash, precision);
    for (size_t i = 0; i < ref.W.size(); ++i) {
      expect_same(ref.W[i].grad(), weights.dW[i], "provider dW" + std::to_string(i));
      expect_same(ref.b[i].grad(), weights.db[i], "provider db" + std::to_string(i));
      EXPECT_FALSE(leaves.W[i].grad().defined());  // the ignored leaves get nothing
    }
    EXPECT_TRUE(weights.held_.empty());
    // Forward in order for each task; backward in reverse, the first layer (input needs no
    // gradient) without a fetch.
    EXPECT_EQ(weights.fwd_order, (std::vector<int>{0, 1, 2, 0, 1, 2}));
    EXPECT_EQ(weights.bwd_order, (std::vector<int>{2, 1, 2, 1}));
  }
}

TEST(TrunkLayer, WeightsFromAProviderUnderBf16GiveTheSameBitsForOneUse) {
  Net ref = make_net({13, 29, 29, 7}, 9);
  PlainWeights weights(ref);
  torch::Tensor x = torch::randn({11, 13});
  torch::manual_seed(5);
  torch::Tensor r = torch::randn({11, 7});
  for (bool trunk : {false, true}) {
    torch::Tensor y;
    {
      const AutocastScope autocast(config::Precision::Bf16, torch::Device(torch::kCPU));
      y = trunk ? trunk_forward(ref, x, &weights) : reference_forward(ref, x);
    }
    (y.to(torch::kFloat32) * r).sum().backward();
  }
  for (size_t i = 0; i < ref.W.size(); ++i) {
    expect_same(ref.W[i].grad(), weights.dW[i], "provider dW" + std::to_string(i));
    expect_same(ref.b[i].grad(), weights.db[i], "provider db" + std::to_string(i));
  }
}

TEST(TrunkLayer, AFrozenProviderIsAPlainForward) {
  Net n = make_net({8, 16, 4}, 8);
  PlainWeights weights(n, /*trained=*/false);
  CopyStash stash;
  torch::Tensor y = trunk_forward(n, torch::randn({3, 8}), &weights, &stash);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(stash.pending(), 0u);  // nothing saved for a backward that never comes
  EXPECT_TRUE(weights.held_.empty());
}

}  // namespace
}  // namespace thetad::daemon
