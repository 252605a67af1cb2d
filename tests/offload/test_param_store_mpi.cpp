// The parameter store under mpirun (1, 2 or 4 ranks on one host): one shared arena per host,
// each group's optimizer step run exactly once per host per active step, offload-on bitwise
// equal to a direct update over 20 steps with evictions and a sharded group, bad settings.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#ifdef THETAD_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "comm/bf16.hpp"
#include "common/errors.hpp"
#include "offload/cpu_adam.hpp"
#include "offload/device.hpp"
#include "offload/host_arena.hpp"
#include "offload/param_store.hpp"

namespace off = thetad::offload;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

constexpr int kTasks = 6;
constexpr int kSteps = 20;
constexpr size_t kShardRows = 10;

// Group 3 is the "huge output layer": a [40 x 33] matrix, 4 shards of 10 rows when sharded.
std::vector<off::GroupShape> shapes() {
  return {{1, 100, 1}, {2, 37, 1}, {3, 40, 33}, {4, 1, 1}, {5, 300, 1}, {6, 8, 9}};
}

// Which tasks (groups) rank r uses at step s: deterministic, known to every rank.
std::vector<int> schedule(int r, int64_t s, int world) {
  std::set<int> g = {1 + static_cast<int>((s * world + r) % kTasks),
                     1 + static_cast<int>((3 * s + r + 2) % kTasks)};
  return {g.begin(), g.end()};
}

float local_grad(float p, size_t i, int r, int64_t s) {
  return p * 0.5f + 0.01f * static_cast<float>((i * 7 + static_cast<size_t>(r) * 13 +
                                                static_cast<size_t>(s) * 5) % 17) - 0.08f;
}

off::AdamHyper hyper(int64_t step) {
  off::AdamHyper h;
  h.lr = 1e-2;
  h.weight_decay = 0.01;
  h.decoupled = true;
  h.step = step;
  return h;
}

std::vector<float> initial(int group, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.001f * static_cast<float>((i * 31 + group * 7) % 97) - 0.05f;
  return v;
}

// Counts device bytes so that tests can check θ never takes more than the slots.
class CountingDevice final : public off::Device {
 public:
  explicit CountingDevice(off::Device& inner) : inner_(inner) {}
  std::string name() const override { return "counting(" + inner_.name() + ")"; }
  bool is_host() const override { return inner_.is_host(); }
  void* alloc(size_t bytes) override {
    live_ += bytes;
    peak_ = std::max(peak_, live_);
    return inner_.alloc(bytes);
  }
  void free(void* p) noexcept override { inner_.free(p); }
  void pin_host(void* p, size_t b) override { inner_.pin_host(p, b); }
  void unpin_host(void* p) noexcept override { inner_.unpin_host(p); }
  off::Fence h2d(void* d, const void* s, size_t b, const off::Fence& a) override {
    h2d_bytes_ += b;
    return inner_.h2d(d, s, b, a);
  }
  off::Fence d2h(void* d, const void* s, size_t b, const off::Fence& a) override { return inner_.d2h(d, s, b, a); }
  off::Fence widen_bf16(float* d, const uint16_t* s, size_t n, const off::Fence& a) override {
    widened_ += n;
    return inner_.widen_bf16(d, s, n, a);
  }
  off::Fence record_compute() override { return inner_.record_compute(); }
  void compute_wait(const off::Fence& f) override { inner_.compute_wait(f); }
  void host_wait(const off::Fence& f) override { inner_.host_wait(f); }
  bool done(const off::Fence& f) override { return inner_.done(f); }
  size_t peak() const { return peak_; }
  size_t h2d_bytes() const { return h2d_bytes_; }
  size_t widened() const { return widened_; }

 private:
  off::Device& inner_;
  size_t live_ = 0, peak_ = 0, h2d_bytes_ = 0, widened_ = 0;
};

// Moves test data in and out of "device" memory: memcpy on the host, cudaMemcpy on a GPU.
struct Mover {
  bool cuda = false;
  void to_host(void* dst, const void* src, size_t bytes) const {
#ifdef THETAD_WITH_CUDA
    if (cuda) {
      ASSERT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      return;
    }
#endif
    std::memcpy(dst, src, bytes);
  }
  void to_device(void* dst, const void* src, size_t bytes) const {
#ifdef THETAD_WITH_CUDA
    if (cuda) {
      ASSERT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
      return;
    }
#endif
    std::memcpy(dst, src, bytes);
  }
};

struct RunResult {
  uint64_t mismatched_acquires = 0;
  off::StoreStats stats;
  std::vector<uint64_t> active_count;  // per group id
  std::vector<uint64_t> seq;           // arena seq per group id, at the end
  size_t slots = 0, slot_bytes = 0;
};

// Sum over the ranks of this host.
uint64_t node_sum(uint64_t x) {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  uint64_t sum = 0;
  MPI_Allreduce(&x, &sum, 1, MPI_UINT64_T, MPI_SUM, node);
  MPI_Comm_free(&node);
  return sum;
}

// Trains kSteps steps through the store and, alongside, a direct update of plain arrays; every
// acquired unit and the final params, m and v must equal the direct update bit for bit.
RunResult train(const off::StoreOptions& opts, off::Device& device, const Mover& mover,
                void* device_grad_buf /* >= largest group, device memory */) {
  const int rank = world_rank(), world = world_size();
  const auto groups = shapes();
  off::ParamStore store(opts, groups, device,
                        [&](int64_t s) { return schedule(rank, s, world); });
  RunResult res;
  res.slots = static_cast<size_t>(store.plan().slots);
  res.slot_bytes = store.plan().slot_bytes;
  res.active_count.assign(kTasks + 1, 0);

  // Direct update state, per group id.
  std::vector<std::vector<float>> rp(kTasks + 1), rm(kTasks + 1), rv(kTasks + 1);
  for (const auto& g : groups) {
    const size_t n = g.rows * g.row_elems;
    rp[g.group] = initial(g.group, n);
    rm[g.group].assign(n, 0.f);
    rv[g.group].assign(n, 0.f);
  }
  // Each group's owner writes it straight into the arena, once per host.
  std::atomic<uint64_t> fills{0};
  store.init_all([&](int group, float* dst) {
    std::memcpy(dst, rp[group].data(), rp[group].size() * sizeof(float));
    fills += 1;
  });
  EXPECT_EQ(node_sum(fills.load()), groups.size());

  // What the device holds of a master value: itself, or (bf16_copies) its bf16 rounding.
  const auto on_device = [&](float x) {
    return opts.bf16_copies ? thetad::comm::bf16_to_float(thetad::comm::float_to_bf16(x)) : x;
  };
  std::vector<float> host(2000), mine(2000), all, reduced, want;
  for (int64_t s = 0; s < kSteps; ++s) {
    const auto used = schedule(rank, s, world);
    std::vector<std::vector<float>> grads(kTasks + 1);
    for (int g : used) {
      grads[g].assign(rp[g].size(), 0.f);
      for (int u : store.plan().units_of(g)) {
        const off::UnitInfo& info = store.plan().unit(u);
        const float* dev = store.acquire(u, s);
        mover.to_host(host.data(), dev, info.numel * sizeof(float));
        want.resize(info.numel);
        for (size_t i = 0; i < info.numel; ++i) want[i] = on_device(rp[g][info.offset + i]);
        if (std::memcmp(host.data(), want.data(), info.numel * sizeof(float)) != 0) ++res.mismatched_acquires;
        for (size_t i = 0; i < info.numel; ++i)
          grads[g][info.offset + i] = local_grad(host[i], info.offset + i, rank, s);
        if (store.plan().units_of(g).size() > 1) store.release(u);  // shard loop: next shard may reuse
      }
    }
    store.prefetch_for(s);

    // "Allreduce" over every globally active group, in group order: gather every rank's
    // gradient and sum the contributors in rank order, so that the direct update (which
    // recomputes each rank's gradient from its own arrays) can match it bit for bit.
    for (const auto& gs : groups) {
      const int g = gs.group;
      std::vector<int> contributors;
      for (int r = 0; r < world; ++r) {
        const auto sr = schedule(r, s, world);
        if (std::find(sr.begin(), sr.end(), g) != sr.end()) contributors.push_back(r);
      }
      if (contributors.empty()) continue;  // lazy: nobody used it, nobody steps it
      const size_t n = rp[g].size();
      mine.assign(n, 0.f);
      if (!grads[g].empty()) mine = grads[g];
      all.assign(n * static_cast<size_t>(world), 0.f);
      MPI_Allgather(mine.data(), static_cast<int>(n), MPI_FLOAT, all.data(), static_cast<int>(n),
                    MPI_FLOAT, MPI_COMM_WORLD);
      reduced.assign(n, 0.f);
      std::vector<float> ref(n, 0.f);
      for (int r : contributors)
        for (size_t i = 0; i < n; ++i) {
          reduced[i] += all[static_cast<size_t>(r) * n + i];
          ref[i] += local_grad(on_device(rp[g][i]), i, r, s);
        }
      const float c = static_cast<float>(contributors.size());
      for (size_t i = 0; i < n; ++i) {
        reduced[i] /= c;
        ref[i] /= c;
      }
      const off::AdamHyper h = hyper(static_cast<int64_t>(++res.active_count[g]));
      mover.to_device(device_grad_buf, reduced.data(), n * sizeof(float));
      for (int u : store.plan().units_of(g))
        store.push_grad(u, static_cast<float*>(device_grad_buf) + store.plan().unit(u).offset);
      store.step_group(g, h);
      off::adam_step(rp[g].data(), ref.data(), rm[g].data(), rv[g].data(), n, h);
      // The test reuses one gradient buffer; a real caller would not wait here.
      store.wait_idle();
    }
    store.release_step(s);
  }

  store.wait_idle();
  std::vector<float> p, m, v;
  for (const auto& g : groups) {
    const size_t n = rp[g.group].size();
    p.resize(n), m.resize(n), v.resize(n);
    store.read_group(g.group, p.data(), m.data(), v.data());
    EXPECT_EQ(std::memcmp(p.data(), rp[g.group].data(), n * 4), 0) << "params of group " << g.group;
    EXPECT_EQ(std::memcmp(m.data(), rm[g.group].data(), n * 4), 0) << "exp_avg of group " << g.group;
    EXPECT_EQ(std::memcmp(v.data(), rv[g.group].data(), n * 4), 0) << "exp_avg_sq of group " << g.group;
  }
  res.seq.assign(kTasks + 1, 0);
  for (size_t i = 0; i < store.arena().entries(); ++i)
    res.seq[static_cast<size_t>(store.arena().entry(i).group)] = store.arena().seq(i).load();
  res.stats = store.stats();
  MPI_Barrier(MPI_COMM_WORLD);
  return res;
}

void check_run(const RunResult& r) {
  EXPECT_EQ(r.mismatched_acquires, 0u) << "an acquired unit did not hold the current values";
  uint64_t expected_steps = 0;
  for (int g = 1; g <= kTasks; ++g) {
    EXPECT_EQ(r.seq[g], r.active_count[g]) << "group " << g << " stepped a wrong number of times";
    expected_steps += r.active_count[g];
  }
  // Exactly once per host per active step: the node's ranks together ran each step once.
  EXPECT_EQ(node_sum(r.stats.optimizer_steps), expected_steps);
}

struct Variant {
  const char* name;
  bool async;
  bool shard;
  bool budget;
  bool bf16 = false;  // StoreOptions::bf16_copies
};

class StoreVsDirect : public ::testing::TestWithParam<Variant> {};

TEST_P(StoreVsDirect, BitwiseEqualOver20Steps) {
  const Variant var = GetParam();
  off::HostDevice host;
  CountingDevice dev(host);
  off::StoreOptions o;
  o.async_step = var.async;
  o.device_slots = 3;  // fewer than the 6 groups: evictions must happen
  o.prefetch = 1;
  if (var.shard) o.shard_bytes = kShardRows * 33 * sizeof(float);
  if (var.budget) o.device_budget_bytes = 3 * 40 * 33 * sizeof(float) / (var.shard ? 4 : 1) + 100;
  o.bf16_copies = var.bf16;
  std::vector<float> grad_buf(2000);
  const RunResult r = train(o, dev, Mover{}, grad_buf.data());
  check_run(r);
  EXPECT_EQ(r.slots, 3u);
  // bf16 copies land in a staging buffer of half a slot (and one element) per slot.
  const size_t stage = var.bf16 ? r.slot_bytes / 2 + sizeof(uint16_t) : 0;
  EXPECT_EQ(dev.peak(), r.slots * (r.slot_bytes + stage)) << "device memory for θ beyond the slots";
  if (var.budget) {
    EXPECT_LE(dev.peak(), o.device_budget_bytes);
  }
  EXPECT_EQ(r.slot_bytes, (var.shard ? kShardRows : 40) * 33 * sizeof(float));
  EXPECT_GT(node_sum(r.stats.evictions), 0u);
  EXPECT_GT(node_sum(r.stats.swap_hits), 0u);
  EXPECT_GT(node_sum(r.stats.swap_misses), 0u);
  EXPECT_GT(r.stats.h2d_bytes, 0u);
  EXPECT_EQ(r.stats.h2d_bytes, dev.h2d_bytes()) << "h2d_bytes is not what crossed";
  // bf16 copies: every byte that crossed was a bf16 value widened on the device (2 bytes per
  // element instead of 4); fp32 copies widen nothing.
  EXPECT_EQ(dev.widened() * sizeof(uint16_t), var.bf16 ? dev.h2d_bytes() : 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Offload, StoreVsDirect,
    ::testing::Values(Variant{"async", true, false, false}, Variant{"sync", false, false, false},
                      Variant{"async_sharded", true, true, false},
                      Variant{"sync_sharded_budget", false, true, true},
                      Variant{"async_budget", true, false, true},
                      Variant{"async_bf16", true, false, false, true},
                      Variant{"sync_sharded_bf16", false, true, false, true}),
    [](const ::testing::TestParamInfo<Variant>& i) { return std::string(i.param.name); });

TEST(HostArenaMpi, OneSharedWindowPerHost) {
  const std::vector<off::ArenaEntry> entries = {{1, 1000}, {2, 17}, {3, 4096}, {4, 5}, {5, 1}};
  off::HostArena arena(thetad::comm::make_node_memory(), entries, 0, nullptr);
  // Only one rank of the host allocated; the others mapped its segment.
  const uint64_t allocated = node_sum(arena.local_alloc_bytes());
  const uint64_t allocators = node_sum(arena.local_alloc_bytes() > 0 ? 1 : 0);
  EXPECT_EQ(allocators, 1u);
  EXPECT_GE(allocated, arena.bytes());
  EXPECT_LE(allocated, arena.bytes() + 4096);  // one page of slack to page-align the base
  EXPECT_EQ(arena.bytes(), off::HostArena::required_bytes(entries));
  // Params, m, v and grad of every group: 16 bytes per parameter plus alignment.
  size_t params = 0;
  for (const auto& e : entries) params += e.numel;
  EXPECT_GE(arena.bytes(), 16 * params);
  EXPECT_LE(arena.bytes(), 16 * params + entries.size() * (4 * 64 + 4096) + 2 * 4096);
  // Owners write, everyone reads the same memory once the sequence number says so.
  for (size_t i = 0; i < arena.entries(); ++i) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(arena.params(i)) % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(arena.grad(i)) % 64, 0u);
    if (arena.is_owner(i)) {
      for (size_t k = 0; k < entries[i].numel; ++k) arena.params(i)[k] = float(i * 1000 + k);
      arena.publish(i);
    }
  }
  for (size_t i = 0; i < arena.entries(); ++i) {
    arena.wait_seq(i, 1, 30.0);
    for (size_t k = 0; k < entries[i].numel; ++k)
      ASSERT_EQ(arena.params(i)[k], float(i * 1000 + k));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Each bad setting: ConfigError naming the offload.* key that fixes it, on every rank alike.
void expect_config_error(const off::StoreOptions& o, const std::vector<off::GroupShape>& g,
                         const std::string& names) {
  off::HostDevice dev;
  try {
    off::ParamStore store(o, g, dev, [](int64_t) { return std::vector<int>{}; });
    ADD_FAILURE() << "no ConfigError; expected one naming " << names;
  } catch (const thetad::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
    EXPECT_EQ(e.exit_code(), 2);
    if (world_rank() == 0) std::printf("  [message] %s\n", e.what());
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(StoreSettings, SlotsBelowOne) {
  off::StoreOptions o;
  o.device_slots = 0;
  expect_config_error(o, shapes(), "offload.device_slots");
}

TEST(StoreSettings, UnitLargerThanBudgetWithoutSharding) {
  off::StoreOptions o;
  o.device_budget_bytes = 1000;  // group 3 alone is 5280 bytes
  expect_config_error(o, shapes(), "offload.shard_mb");
  expect_config_error(o, shapes(), "offload.device_budget_mb");
}

TEST(StoreSettings, RowLargerThanShard) {
  off::StoreOptions o;
  o.shard_bytes = 100;  // one row of group 3 is 132 bytes
  expect_config_error(o, shapes(), "offload.shard_mb");
}

TEST(StoreSettings, ArenaLargerThanHostLimit) {
  off::StoreOptions o;
  o.host_limit_bytes = 4096;
  expect_config_error(o, shapes(), "offload.host_limit_mb");
}

TEST(StoreSettings, ArenaLargerThanHostMemory) {
  off::StoreOptions o;
  // 2^40 parameters: 16 TiB of arena, more than any CI machine has.
  expect_config_error(o, {{1, size_t{1} << 30, 1024}}, "MemAvailable");
}

TEST(CudaStore, MatchesDirectUpdateOnGpu) {
#ifdef THETAD_WITH_CUDA
  if (!off::cuda_available()) GTEST_SKIP() << "no GPU";
  int ngpu = 0;
  cudaGetDeviceCount(&ngpu);
  const int gpu = world_rank() % ngpu;
  cudaSetDevice(gpu);
  auto cuda = off::make_cuda_device(gpu, nullptr);
  void* grad_buf = nullptr;
  ASSERT_EQ(cudaMalloc(&grad_buf, 2000 * sizeof(float)), cudaSuccess);
  // bf16 copies: the device's widening kernel gives the bits the host's rounding promises.
  for (int variant = 0; variant < 4; ++variant) {
    const bool shard = variant & 1, bf16 = variant & 2;
    off::StoreOptions o;
    o.device_slots = 3;
    o.async_step = true;
    o.bf16_copies = bf16;
    if (shard) o.shard_bytes = kShardRows * 33 * sizeof(float);
    const RunResult r = train(o, *cuda, Mover{true}, grad_buf);
    check_run(r);
    EXPECT_GT(node_sum(r.stats.evictions), 0u);
  }
  cudaFree(grad_buf);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

}  // namespace
