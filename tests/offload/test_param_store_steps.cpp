// The parameter store within and across steps, on devices that copy like the host device and
// observe or gate the copies and waits (under mpirun with test_param_store_mpi.cpp, 1, 2 or 4
// ranks): prefetch within a step, groups the arena does not hold, a device cache sized after the
// first step, the owner's update order.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/errors.hpp"
#include "offload/cpu_adam.hpp"
#include "offload/device.hpp"
#include "offload/param_store.hpp"

namespace off = thetad::offload;

// Test devices that copy like the host device and observe or gate the copies and waits.
class HostBackedDevice : public off::Device {
 public:
  bool is_host() const override { return true; }
  void* alloc(size_t bytes) override { return host_.alloc(bytes); }
  void free(void* ptr) noexcept override { host_.free(ptr); }
  void pin_host(void*, size_t) override {}
  void unpin_host(void*) noexcept override {}
  off::Fence widen_bf16(float* dst, const uint16_t* src, size_t n, const off::Fence& after) override {
    return host_.widen_bf16(dst, src, n, after);
  }
  off::Fence record_compute() override { return {}; }

 protected:
  off::HostDevice host_;
};

// Streamed layers (offload.shared: stream) prefetch within a step: acquire(unit, step, false)
// starts the copy without making compute wait for it (compute queued before the unit's own
// overlaps the copy); order_compute(unit) then makes compute wait for exactly that copy.
class RecordingDevice final : public HostBackedDevice {
 public:
  std::string name() const override { return "recording"; }
  off::Fence h2d(void* dst, const void* src, size_t bytes, const off::Fence& after) override {
    host_.h2d(dst, src, bytes, after);
    last_copy = std::make_shared<int>(++copies);
    return {last_copy};
  }
  off::Fence d2h(void* dst, const void* src, size_t bytes, const off::Fence& after) override {
    return host_.d2h(dst, src, bytes, after);
  }
  void compute_wait(const off::Fence& f) override { waits.push_back(f.event); }
  void host_wait(const off::Fence&) override {}
  bool done(const off::Fence&) override { return true; }
  int copies = 0;
  std::shared_ptr<void> last_copy;
  std::vector<std::shared_ptr<void>> waits;
};

TEST(StoreWithinStep, PrefetchDoesNotOrderComputeUntilAsked) {
  RecordingDevice dev;
  off::StoreOptions o;
  o.device_slots = 2;
  o.prefetch = 0;
  off::ParamStore store(o, {{1, 10, 1}, {2, 20, 1}}, dev, [](int64_t) { return std::vector<int>{1, 2}; });
  store.init_all([](int g, float* dst) {
    for (int i = 0; i < (g == 1 ? 10 : 20); ++i) dst[i] = float(g * 100 + i);
  });
  const int u1 = store.plan().units_of(1).at(0), u2 = store.plan().units_of(2).at(0);
  const float* a = store.acquire(u1, 0);  // ordered: compute waits for its copy
  ASSERT_EQ(dev.waits.size(), 1u);
  EXPECT_EQ(dev.waits.back(), dev.last_copy);
  const float* b = store.acquire(u2, 0, /*order_compute=*/false);  // the prefetch
  EXPECT_EQ(dev.copies, 2);
  EXPECT_EQ(dev.waits.size(), 1u) << "a prefetch must not make compute wait";
  const auto prefetched = dev.last_copy;
  store.release(u1);
  store.order_compute(u2);
  ASSERT_EQ(dev.waits.size(), 2u);
  EXPECT_EQ(dev.waits.back(), prefetched);
  EXPECT_EQ(a[3], 103.f);
  EXPECT_EQ(b[19], 219.f);
  store.release_step(0);
  MPI_Barrier(MPI_COMM_WORLD);
}

// offload.host_groups: scheduled: a group the job never uses (held = false) takes no arena memory
// and is never filled; the held ones work as before, and touching the other is an InternalError.
TEST(StoreHeldGroups, AGroupNotHeldHasNoArenaMemory) {
  RecordingDevice dev;
  off::StoreOptions o;
  o.device_slots = 1;
  o.prefetch = 0;
  const std::vector<off::GroupShape> all = {{1, 1000, 1}, {2, 3000, 1}};
  std::vector<off::GroupShape> some = all;
  some[1].held = false;
  const size_t full = off::HostArena::required_bytes({{1, 1000}, {2, 3000}});
  off::ParamStore store(o, some, dev, [](int64_t) { return std::vector<int>{1}; });
  EXPECT_TRUE(store.held(1));
  EXPECT_FALSE(store.held(2));
  EXPECT_EQ(store.arena().bytes(), off::HostArena::required_bytes({{1, 1000}, {2, 0}}));
  EXPECT_LT(store.arena().bytes() + 3000 * 16, full + 4096);
  std::vector<int> filled;
  store.init_all([&](int g, float* dst) {
    filled.push_back(g);
    for (int i = 0; i < 1000; ++i) dst[i] = float(i);
  });
  EXPECT_EQ(filled, std::vector<int>(store.arena().is_owner(0) ? 1 : 0, 1));
  const float* a = store.acquire(store.plan().units_of(1).at(0), 0);
  EXPECT_EQ(a[7], 7.f);
  store.release_step(0);
  EXPECT_THROW(store.acquire(store.plan().units_of(2).at(0), 1), thetad::InternalError);
  std::vector<float> out(3000);
  EXPECT_THROW(store.read_group(2, out.data(), nullptr, nullptr), thetad::InternalError);
  MPI_Barrier(MPI_COMM_WORLD);
}

// offload.device_cache_mb: auto sizes the cache after the first step: a store built without one
// gets its lines from size_cache, and groups enter them from the next place() on; only once.
TEST(StoreDeviceCache, SizedAfterTheFirstStep) {
  off::HostDevice dev;
  off::StoreOptions o;
  o.device_slots = 2;
  o.prefetch = 0;
  const auto every = [](int64_t) { return std::vector<int>{1, 2}; };
  off::ParamStore store(o, {{1, 10, 1}, {2, 20, 1}}, dev, every, every);
  EXPECT_EQ(store.cache().cache_lines(), 0);
  store.init_all([](int g, float* dst) {
    for (int i = 0; i < (g == 1 ? 10 : 20); ++i) dst[i] = float(g * 100 + i);
  });
  store.cache().size_cache(2 * 3 * 20 * sizeof(float));  // two lines of the larger group (params, m, v)
  EXPECT_EQ(store.cache().cache_lines(), 2);
  store.place(0);
  ASSERT_TRUE(store.cache().cached(1));
  ASSERT_TRUE(store.cache().cached(2));
  EXPECT_EQ(store.cache().cached_params(1)[3], 103.f);
  EXPECT_EQ(store.cache().cached_params(2)[19], 219.f);
  EXPECT_THROW(store.cache().size_cache(store.cache().cache_line_bytes()), thetad::InternalError);
  MPI_Barrier(MPI_COMM_WORLD);
}

// offload.shared: stream: the owner's queued CPU updates whose gradients have landed run lowest
// group first (the next forward needs layer 0 first; backward delivers it last). A device whose
// copies land only when the test opens a gate: the worker takes the oldest update (none has
// landed) and waits in it; the updates queued behind it then run lowest group first.
class GatedDevice final : public HostBackedDevice {
 public:
  std::string name() const override { return "gated"; }
  off::Fence h2d(void* dst, const void* src, size_t bytes, const off::Fence& after) override {
    return host_.h2d(dst, src, bytes, after);
  }
  off::Fence d2h(void* dst, const void* src, size_t bytes, const off::Fence& after) override {
    host_.d2h(dst, src, bytes, after);
    auto f = std::make_shared<int>(group_pushed);
    return {f};
  }
  void compute_wait(const off::Fence&) override {}
  void host_wait(const off::Fence& f) override {
    while (!open.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard<std::mutex> lk(mu);
    if (f.event) ran.push_back(*std::static_pointer_cast<int>(f.event));
  }
  bool done(const off::Fence& f) override { return f.empty() || open.load(); }
  int group_pushed = 0;  // the group whose gradient the next d2h copies
  std::atomic<bool> open{false};
  std::mutex mu;
  std::vector<int> ran;  // groups, in the order the worker waited for their gradients
};

TEST(StoreUpdateOrder, LowestGroupFirstOnceLanded) {
  GatedDevice dev;
  off::StoreOptions o;
  o.device_slots = 4;
  o.prefetch = 0;
  o.lowest_group_first = true;
  off::ParamStore store(o, {{1, 8, 1}, {2, 8, 1}, {3, 8, 1}, {4, 8, 1}}, dev,
                        [](int64_t) { return std::vector<int>{1, 2, 3, 4}; });
  store.init_all([](int, float* dst) { std::fill(dst, dst + 8, 1.f); });
  std::vector<float> grad(8, 0.5f);
  std::vector<int> owned;
  off::AdamHyper h;
  for (int g = 4; g >= 1; --g) {  // backward's order: the last layer's gradient first
    if (store.owns(g)) owned.push_back(g);
    dev.group_pushed = g;
    store.push_grad_range(g, 0, grad.data(), grad.size());
    store.step_group(g, h);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the worker is waiting in the first
  dev.open = true;
  store.wait_idle();
  std::vector<int> expected = owned;
  if (!expected.empty()) std::sort(expected.begin() + 1, expected.end());
  EXPECT_EQ(dev.ran, expected);
  MPI_Barrier(MPI_COMM_WORLD);
}

// A streamed trunk's split that chose no layers (offload.shared_split_layers: auto) gives its
// update lines back: the device memory they held is freed at once and no group can use them.
class CountingDevice final : public HostBackedDevice {
 public:
  std::string name() const override { return "counting"; }
  void* alloc(size_t bytes) override {
    void* p = host_.alloc(bytes);
    live_[p] = bytes;
    return p;
  }
  void free(void* ptr) noexcept override {
    live_.erase(ptr);
    host_.free(ptr);
  }
  off::Fence h2d(void* dst, const void* src, size_t bytes, const off::Fence& after) override {
    return host_.h2d(dst, src, bytes, after);
  }
  off::Fence d2h(void* dst, const void* src, size_t bytes, const off::Fence& after) override {
    return host_.d2h(dst, src, bytes, after);
  }
  void compute_wait(const off::Fence&) override {}
  void host_wait(const off::Fence&) override {}
  bool done(const off::Fence&) override { return true; }
  size_t live_bytes() const {
    size_t n = 0;
    for (const auto& [p, b] : live_) n += b;
    return n;
  }

 private:
  std::map<void*, size_t> live_;
};

TEST(StoreUpdateLines, DroppedLinesFreeTheirDeviceMemory) {
  CountingDevice dev;
  off::StoreOptions o;
  o.device_slots = 1;
  o.prefetch = 0;
  o.update_lines = 3;
  off::ParamStore store(o, {{1, 10, 1}, {2, 20, 1}}, dev, [](int64_t) { return std::vector<int>{1}; });
  const size_t lines = 3 * 3 * 20 * sizeof(float);  // three lines of the largest group's values, m, v
  ASSERT_EQ(store.update_line_bytes(), lines);
  EXPECT_TRUE(store.update_room());
  const size_t before = dev.live_bytes();
  store.drop_update_lines();
  EXPECT_EQ(store.update_line_bytes(), 0u);
  EXPECT_FALSE(store.update_room());
  EXPECT_EQ(dev.live_bytes() + lines, before);
  store.drop_update_lines();  // a second time: nothing left to free
  EXPECT_EQ(dev.live_bytes() + lines, before);
  MPI_Barrier(MPI_COMM_WORLD);
}
