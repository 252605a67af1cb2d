// The chunked softmax cross-entropy of the sharded extreme classifier against plain LibTorch
// (cross_entropy over addmm): loss, the encoder-side gradient and the slice's gradient, for
// chunks of 1, 3 and all rows; gradient accumulation; the parameter's post hook (the engine's
// mark_ready); and the streaming discipline a store-backed source relies on.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <algorithm>
#include <set>

#include "daemon/models/chunked_softmax.hpp"

namespace thetad::daemon {
namespace {

constexpr int64_t kBatch = 7, kHidden = 5, kRows = 10;

struct Case {
  torch::Tensor h, w, y;
};

Case make_case(uint64_t seed) {
  torch::manual_seed(seed);
  Case c;
  c.h = torch::randn({kBatch, kHidden}).set_requires_grad(true);
  c.w = torch::randn({kRows, kHidden + 1}).set_requires_grad(true);
  c.y = torch::randint(kRows, {kBatch}, torch::kInt64);
  return c;
}

// Plain LibTorch: loss, dL/dh, dL/dW for W = [weight, bias].
std::vector<torch::Tensor> plain(const Case& c) {
  auto h = c.h.detach().clone().set_requires_grad(true);
  auto w = c.w.detach().clone().set_requires_grad(true);
  auto logits = torch::addmm(w.select(1, kHidden), h, w.narrow(1, 0, kHidden).t());
  auto loss = torch::nn::functional::cross_entropy(logits, c.y);
  loss.backward();
  return {loss.detach(), h.grad(), w.grad()};
}

void expect_close(const torch::Tensor& a, const torch::Tensor& b, const char* what) {
  ASSERT_TRUE(a.defined()) << what;
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  EXPECT_LE((a - b).abs().max().item<double>(), 1e-5) << what;
}

// A source that hands out copies (the parameter's own data is never read in the passes) and
// checks the streaming discipline: at most two chunks held, each given back, none twice.
class CopyingSource : public ShardSource {
 public:
  CopyingSource(torch::Tensor w, int64_t chunk_rows) : inner_({std::move(w)}, chunk_rows) {}
  int num_chunks(int task) override { return inner_.num_chunks(task); }
  torch::Tensor chunk(int task, int k) override {
    EXPECT_TRUE(held_.insert(k).second) << "chunk " << k << " requested twice";
    max_held_ = std::max(max_held_, held_.size());
    ++requests_;
    return inner_.chunk(task, k).clone();
  }
  void done(int, int k) override { EXPECT_EQ(held_.erase(k), 1u) << "chunk " << k << " not held"; }
  size_t max_held_ = 0, requests_ = 0;
  std::set<int> held_;

 private:
  ResidentChunks inner_;
};

class ChunkedSoftmax : public ::testing::TestWithParam<int64_t> {};

TEST_P(ChunkedSoftmax, MatchesCrossEntropy) {
  const Case c = make_case(1 + static_cast<uint64_t>(GetParam()));
  const auto want = plain(c);
  ResidentChunks chunks({c.w}, GetParam());
  auto loss = chunked_softmax_xent(c.h, c.w, c.y, chunks, 0);
  expect_close(loss.detach(), want[0], "loss");
  loss.backward();
  expect_close(c.h.grad(), want[1], "dh");
  expect_close(c.w.grad(), want[2], "dW");
}

TEST_P(ChunkedSoftmax, AccumulatesIntoExistingGrad) {
  const Case c = make_case(11);
  const auto want = plain(c);
  ResidentChunks chunks({c.w}, GetParam());
  chunked_softmax_xent(c.h, c.w, c.y, chunks, 0).backward();
  chunked_softmax_xent(c.h, c.w, c.y, chunks, 0).backward();
  expect_close(c.w.grad(), 2 * want[2], "dW twice");
  expect_close(c.h.grad(), 2 * want[1], "dh twice");
}

TEST_P(ChunkedSoftmax, StreamsFromSourceOnly) {
  const Case c = make_case(21);
  const auto want = plain(c);
  CopyingSource source(c.w.detach(), GetParam());
  // The parameter is a placeholder of the right shape (as with the host store): the data comes
  // from the source, the gradient lands in the parameter's .grad (bound beforehand).
  auto placeholder = torch::zeros({1}).expand({kRows, kHidden + 1}).set_requires_grad(true);
  placeholder.mutable_grad() = torch::zeros({kRows, kHidden + 1});
  auto loss = chunked_softmax_xent(c.h, placeholder, c.y, source, 0);
  loss.backward();
  expect_close(loss.detach(), want[0], "loss");
  expect_close(placeholder.grad(), want[2], "dW");
  expect_close(c.h.grad(), want[1], "dh");
  const int64_t n = (kRows + GetParam() - 1) / GetParam();
  EXPECT_EQ(source.requests_, static_cast<size_t>(2 * n));  // once per pass
  EXPECT_LE(source.max_held_, 2u);
  EXPECT_TRUE(source.held_.empty());
}

// Sampled softmax: the classes are the labels plus a few more (rows 0, 4 and 9 stay out so
// that some chunks of 1 and 3 rows hold no class); against cross_entropy over those rows.
TEST_P(ChunkedSoftmax, SampledMatchesCrossEntropyOverTheClasses) {
  const Case c = make_case(41);
  std::set<int64_t> keep{2, 5, 7};
  for (int64_t i = 0; i < kBatch; ++i) keep.insert(c.y[i].item<int64_t>());
  keep.erase(0);
  keep.erase(4);
  keep.erase(9);
  torch::Tensor y = c.y.clone();
  for (int64_t i = 0; i < kBatch; ++i)  // labels must be classes: move the dropped ones
    if (!keep.count(y[i].item<int64_t>())) y[i] = 5;
  const torch::Tensor cls = torch::tensor(std::vector<int64_t>(keep.begin(), keep.end()), torch::kInt64);
  // Plain LibTorch over the selected rows.
  auto h = c.h.detach().clone().set_requires_grad(true);
  auto w = c.w.detach().clone().set_requires_grad(true);
  auto ws = w.index_select(0, cls);
  auto logits = torch::addmm(ws.select(1, kHidden), h, ws.narrow(1, 0, kHidden).t());
  auto want = torch::nn::functional::cross_entropy(logits, torch::searchsorted(cls, y));
  want.backward();
  CopyingSource source(c.w.detach(), GetParam());
  auto placeholder = torch::zeros({1}).expand({kRows, kHidden + 1}).set_requires_grad(true);
  placeholder.mutable_grad() = torch::zeros({kRows, kHidden + 1});
  auto loss = chunked_sampled_softmax_xent(c.h, placeholder, y, cls, source, 0);
  loss.backward();
  expect_close(loss.detach(), want.detach(), "loss");
  expect_close(c.h.grad(), h.grad(), "dh");
  expect_close(placeholder.grad(), w.grad(), "dW (zero outside the classes)");
  for (int64_t r : {0, 4, 9}) EXPECT_EQ(placeholder.grad()[r].abs().max().item<float>(), 0.0f) << "row " << r;
  EXPECT_LE(source.max_held_, 2u);
  EXPECT_TRUE(source.held_.empty());
}

INSTANTIATE_TEST_SUITE_P(ChunkRows, ChunkedSoftmax, ::testing::Values(1, 3, kRows));

TEST(ChunkedSoftmaxHooks, ParameterPostHookFires) {
  const Case c = make_case(31);
  int fired = 0;
  auto acc = torch::autograd::impl::grad_accumulator(c.w);
  acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [&fired](const torch::autograd::variable_list& out, const torch::autograd::variable_list&) {
        ++fired;
        return out;
      }));
  ResidentChunks chunks({c.w}, 3);
  chunked_softmax_xent(c.h, c.w, c.y, chunks, 0).backward();
  EXPECT_EQ(fired, 1);
  EXPECT_TRUE(c.w.grad().defined());
}

TEST(ChunkedSoftmaxHooks, FrozenSliceGetsNoGradient) {
  const Case c = make_case(41);
  const auto want = plain(c);
  auto w = c.w.detach();
  ResidentChunks chunks({w}, 3);
  chunked_softmax_xent(c.h, w, c.y, chunks, 0).backward();
  EXPECT_FALSE(w.grad().defined());
  expect_close(c.h.grad(), want[1], "dh");
}

TEST(ChunkedSoftmaxHooks, LogitsMatch) {
  const Case c = make_case(51);
  ResidentChunks chunks({c.w}, 3);
  auto want = torch::addmm(c.w.select(1, kHidden), c.h, c.w.narrow(1, 0, kHidden).t());
  expect_close(chunked_logits(c.h, chunks, 0), want.detach(), "logits");
}

}  // namespace
}  // namespace thetad::daemon
