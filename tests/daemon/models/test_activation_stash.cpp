// The pooled activation stash on the host device (the CPU build's "device"): trunk layers give
// the same gradient bits with it as without, at most two layers' saved tensors are held on the
// device at once, and the pinned pool allocates in the first step only. The transformer's
// feed-forward activation (ffn_activation) gives autograd's bits of the plain expressions, with
// the stash and without, in float32 and under bf16 autocast.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <vector>

#include "common/errors.hpp"
#include "daemon/models/activation_stash.hpp"
#include "daemon/ops/ffn_activation.hpp"
#include "daemon/ops/precision.hpp"
#include "offload/pinned_pool.hpp"

namespace thetad::daemon {
namespace {

struct Trunk {
  std::vector<torch::Tensor> W, b;
  explicit Trunk(const std::vector<int64_t>& dims) {
    torch::manual_seed(17);
    for (size_t i = 0; i + 1 < dims.size(); ++i) {
      W.push_back(torch::randn({dims[i + 1], dims[i]}).set_requires_grad(true));
      b.push_back(torch::randn({dims[i + 1]}).set_requires_grad(true));
    }
  }
  // One step: two tasks through the trunk, one backward; returns the gradients.
  std::vector<torch::Tensor> step(int64_t seed, ActivationStash* stash) {
    for (auto& t : W) t.mutable_grad() = torch::Tensor();
    for (auto& t : b) t.mutable_grad() = torch::Tensor();
    torch::manual_seed(seed);
    torch::Tensor loss;
    for (int64_t rows : {12, 7}) {
      torch::Tensor h = torch::randn({rows, W[0].size(1)});
      for (size_t i = 0; i < W.size(); ++i) h = trunk_layer(h, W[i], b[i], TrunkAct::gelu, int(i), nullptr, stash);
      torch::Tensor l = (h * torch::randn(h.sizes())).sum();
      loss = loss.defined() ? loss + l : l;
    }
    loss.backward();
    std::vector<torch::Tensor> g;
    for (size_t i = 0; i < W.size(); ++i) {
      g.push_back(W[i].grad().clone());
      g.push_back(b[i].grad().clone());
    }
    return g;
  }
};

// Four steps of the trunk with and without the stash: the same gradients' bits every step, and
// the pinned pool allocated in the first step only. check(step, stats) adds a test's own checks.
void expect_same_bits_and_a_fixed_pool(const std::vector<int64_t>& widths, PooledActivationStash& stash,
                                       int64_t seed,
                                       const std::function<void(int64_t, const ActivationStats&)>& check) {
  Trunk plain(widths), offl(widths);
  int64_t allocs_after_first = -1;
  for (int64_t s = 0; s < 4; ++s) {
    auto want = plain.step(seed + s, nullptr);
    auto got = offl.step(seed + s, &stash);
    stash.end_backward();
    for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(torch::equal(want[i], got[i])) << "step " << s << " grad " << i;
    const ActivationStats st = stash.step_stats();
    check(s, st);
    if (s == 0) allocs_after_first = st.pool_allocations;
    EXPECT_EQ(st.pool_allocations, allocs_after_first) << "step " << s << " allocated pinned memory";
  }
  EXPECT_GT(allocs_after_first, 0);
}

TEST(ActivationStash, SameBitsWithinTwoLayersAndThePoolStopsGrowing) {
  PooledActivationStash stash(std::make_unique<offload::HostDevice>());
  expect_same_bits_and_a_fixed_pool({10, 24, 24, 24, 24}, stash, 100, [](int64_t s, const ActivationStats& st) {
    // A layer saves x and z: 12 rows x (24 + 24) floats for the larger task.
    EXPECT_EQ(st.layer_peak_bytes, 12 * (24 + 24) * 4);
    EXPECT_GT(st.device_peak_bytes, 0);
    EXPECT_LE(st.device_peak_bytes, 2 * st.layer_peak_bytes) << "step " << s;
    // Every saved byte goes to the host and comes back (the host device frees nothing early).
    EXPECT_EQ(st.d2h_bytes, st.h2d_bytes);
    // Layer 0 saves x (10 wide) and z (24), the others x and z (24 each); 12 + 7 rows.
    EXPECT_EQ(st.d2h_bytes, (12 + 7) * ((10 + 24) + 3 * (24 + 24)) * 4);
  });
}

// A device whose host-to-device copies complete only when the host waits for them, as on a GPU
// while the host queues the next forward ahead of the last backward (copies land at once).
class LaggingDevice final : public offload::Device {
 public:
  std::string name() const override { return "lagging"; }
  bool is_host() const override { return true; }
  void* alloc(size_t bytes) override { return host_.alloc(bytes); }
  void free(void* ptr) noexcept override { host_.free(ptr); }
  void pin_host(void*, size_t) override {}
  void unpin_host(void*) noexcept override {}
  offload::Fence h2d(void* dst, const void* src, size_t bytes, const offload::Fence& after) override {
    host_.h2d(dst, src, bytes, after);
    return {std::make_shared<bool>(false)};
  }
  offload::Fence d2h(void* dst, const void* src, size_t bytes, const offload::Fence& after) override {
    return host_.d2h(dst, src, bytes, after);
  }
  offload::Fence widen_bf16(float* dst, const uint16_t* src, size_t n, const offload::Fence& after) override {
    return host_.widen_bf16(dst, src, n, after);
  }
  offload::Fence record_compute() override { return {}; }
  void compute_wait(const offload::Fence&) override {}
  void host_wait(const offload::Fence& f) override {
    if (f.event) *std::static_pointer_cast<bool>(f.event) = true;
  }
  bool done(const offload::Fence& f) override { return !f.event || *std::static_pointer_cast<bool>(f.event); }

 private:
  offload::HostDevice host_;
};

TEST(ActivationStash, ThePoolDoesNotGrowWhileTheHostRunsAhead) {
  PooledActivationStash stash(std::make_unique<LaggingDevice>());
  expect_same_bits_and_a_fixed_pool({10, 24, 24, 24}, stash, 200, [](int64_t, const ActivationStats&) {});
}

TEST(ActivationStash, AWiderWindowHoldsMore) {
  Trunk offl({10, 24, 24, 24, 24, 24});
  PooledActivationStash stash(std::make_unique<offload::HostDevice>(), /*window=*/2);
  offl.step(5, &stash);
  stash.end_backward();
  const ActivationStats st = stash.step_stats();
  EXPECT_GT(st.device_peak_bytes, 2 * 7 * (24 + 24) * 4);  // three layers of some task at once
  EXPECT_LE(st.device_peak_bytes, 3 * st.layer_peak_bytes);
}

TEST(ActivationStash, AnUnknownTicketIsAnInternalError) {
  PooledActivationStash stash(std::make_unique<offload::HostDevice>());
  EXPECT_THROW(stash.take(3), InternalError);
}

// Two layers of gelu(x U^T) (gate: silu(x G^T) * x U^T) and a weighted sum, under `precision`;
// the gradients of U (and G). `mode`: 0 the plain expressions, 1 ffn_activation, 2 with the stash.
std::vector<torch::Tensor> ffn_grads(bool swiglu, config::Precision precision, int mode, ActivationStash* stash) {
  torch::manual_seed(23);
  const torch::Tensor x0 = torch::randn({9, 8});
  std::vector<torch::Tensor> U, G;
  for (int i = 0; i < 2; ++i) {
    U.push_back(torch::randn({8, 8}).set_requires_grad(true));
    G.push_back(torch::randn({8, 8}).set_requires_grad(true));
  }
  const torch::Tensor w = torch::randn({9, 8});
  torch::Tensor h = x0;
  {
    const AutocastScope autocast(precision, torch::Device(torch::kCPU));
    for (int i = 0; i < 2; ++i) {
      const torch::Tensor up = torch::linear(h, U[i]);
      const torch::Tensor gate = swiglu ? torch::linear(h, G[i]) : torch::Tensor();
      if (mode == 0) h = swiglu ? torch::silu(gate) * up : torch::gelu(up);
      else h = ffn_activation(gate, up, i, mode == 2 ? stash : nullptr);
    }
  }
  (h.to(torch::kFloat32) * w).sum().backward();
  std::vector<torch::Tensor> g = {U[0].grad(), U[1].grad()};
  if (swiglu) g.insert(g.end(), {G[0].grad(), G[1].grad()});
  return g;
}

TEST(FfnActivation, GivesAutogradsBitsWithAndWithoutTheStash) {
  for (bool swiglu : {false, true}) {
    for (config::Precision p : {config::Precision::Fp32, config::Precision::Bf16}) {
      PooledActivationStash stash(std::make_unique<offload::HostDevice>());
      const auto want = ffn_grads(swiglu, p, 0, nullptr);
      const auto fn = ffn_grads(swiglu, p, 1, nullptr);
      const auto stashed = ffn_grads(swiglu, p, 2, &stash);
      const ActivationStats st = stash.step_stats();
      stash.end_backward();
      EXPECT_GT(st.d2h_bytes, 0);
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_TRUE(torch::equal(want[i], fn[i])) << "swiglu " << swiglu << " grad " << i;
        EXPECT_TRUE(torch::equal(want[i], stashed[i])) << "swiglu " << swiglu << " grad " << i << " (stash)";
      }
    }
  }
}

TEST(PinnedPool, ReusesBuffersBySizeClass) {
  offload::HostDevice dev;
  offload::PinnedPool pool(dev);
  auto a = pool.get(5000), b = pool.get(100);
  EXPECT_EQ(a.bytes, 8192u);
  EXPECT_EQ(b.bytes, 4096u);
  pool.put(a);
  auto c = pool.get(7000);  // same class as a: reused
  EXPECT_EQ(c.ptr, a.ptr);
  EXPECT_EQ(pool.allocations(), 2);
  EXPECT_EQ(pool.bytes(), 8192u + 4096u);
  pool.put(b);
  pool.put(c);
}

}  // namespace
}  // namespace thetad::daemon
