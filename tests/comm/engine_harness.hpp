// Shared by the engine tests over MPI and NCCL: a small multi-task model, fake gradients that
// are a deterministic function of (rank, step, micro-step, parameter, element) and exact in
// float32 (multiples of 1/8, so sums do not depend on the reduction order), per-rank active sets,
// and the reference every rank computes for every rank's gradients.
#pragma once

#include <chrono>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "comm/engine.hpp"

namespace thetad::comm::testing {

constexpr int kTasks = 5;  // groups 1..5; group 0 is the trunk
constexpr int kGroups = kTasks + 1;

inline std::vector<ParamInfo> model_params() {
  std::vector<ParamInfo> ps;
  for (int i = 0; i < 5; ++i) ps.push_back({"trunk." + std::to_string(i) + ".weight", 37u + 11u * i, 0});
  for (int t = 1; t <= kTasks; ++t) {
    ps.push_back({"heads." + std::to_string(t) + ".0.weight", 23u + t, t});
    ps.push_back({"heads." + std::to_string(t) + ".0.bias", 3, t});
    ps.push_back({"heads." + std::to_string(t) + ".1.weight", 19, t});
  }
  return ps;
}

inline BucketPlan model_plan() {
  BucketPlanOptions o;
  o.bucket_cap_bytes = 200;  // several buckets per group
  o.first_bucket_bytes = 64;
  return make_bucket_plan(model_params(), kGroups, o);
}

inline float fake_grad(int rank, int64_t step, int micro, int param, size_t i) {
  const int64_t k = (rank * 7 + step * 13 + micro * 5 + param * 31 + static_cast<int64_t>(i) * 3) % 17;
  return static_cast<float>(k - 8) / 8.0f;
}

// Which groups `rank` trains in (step, micro). Task 5 is never used; task 4 only on rank 0 (a
// group other ranks must zero-fill); the trunk is skipped now and then; the rest is random.
inline std::vector<uint8_t> active_groups(int rank, int64_t step, int micro) {
  std::mt19937 rng(static_cast<uint32_t>(1000 * rank + 17 * step + micro + 1));
  std::vector<uint8_t> a(kGroups, 0);
  a[0] = (step % 7 == 3) ? 0 : 1;
  for (int t = 1; t <= 3; ++t) a[t] = (rng() % 100) < 40;
  a[4] = rank == 0 && step % 2 == 0;
  a[5] = 0;
  return a;
}

struct Reference {
  std::vector<std::vector<float>> grads;  // per param
  std::vector<int32_t> contributors;      // per group
  int64_t bytes_pruned_on = 0;
};

inline Reference reference(const BucketPlan& plan, int world, int64_t step, int micros, Average avg) {
  Reference ref;
  ref.contributors.assign(kGroups, 0);
  for (int r = 0; r < world; ++r) {
    std::vector<uint8_t> u(kGroups, 0);
    for (int m = 0; m < micros; ++m) {
      auto a = active_groups(r, step, m);
      for (int g = 0; g < kGroups; ++g) u[g] |= a[g];
    }
    for (int g = 0; g < kGroups; ++g) ref.contributors[g] += u[g];
  }
  for (size_t p = 0; p < plan.params.size(); ++p) {
    const ParamInfo& info = plan.params[p];
    std::vector<float> sum(info.numel, 0.0f);
    for (int r = 0; r < world; ++r)
      for (int m = 0; m < micros; ++m)
        if (active_groups(r, step, m)[info.group])
          for (size_t i = 0; i < info.numel; ++i) sum[i] += fake_grad(r, step, m, static_cast<int>(p), i);
    const int c = ref.contributors[info.group];
    const double div = avg == Average::world ? world : std::max(1, c);
    for (float& x : sum) x = static_cast<float>(x / div);
    ref.grads.push_back(std::move(sum));
    if (c > 0) ref.bytes_pruned_on += static_cast<int64_t>(4 * info.numel);
  }
  return ref;
}

// How the test reaches the engine's gradient memory (host or device).
struct Memory {
  std::function<void(float* dst, const std::vector<float>& add)> accumulate;
  std::function<std::vector<float>(const float* src, size_t n)> read;
  std::function<void(float* dst, const std::vector<float>& values)> write;
};

inline Memory host_memory() {
  return {[](float* dst, const std::vector<float>& add) {
            for (size_t i = 0; i < add.size(); ++i) dst[i] += add[i];
          },
          [](const float* src, size_t n) { return std::vector<float>(src, src + n); },
          [](float* dst, const std::vector<float>& v) { std::copy(v.begin(), v.end(), dst); }};
}

struct RunResult {
  std::vector<std::vector<std::vector<float>>> grads;  // per step, per param
  std::vector<StepStats> stats;
};

// Runs `steps` windows of `micros` micro-steps; marks parameters in a per-rank shuffled order.
// Groups of GradMemory::overwrite in `grad_memory` (EngineOptions::grad_memory) get each
// parameter's first gradient of a window written over the buffer's old contents, later ones added.
// `on_window` runs after each start_window (Engine::keep).
inline RunResult run_engine(Engine& engine, const Memory& mem, int steps, int micros,
                            const std::vector<GradMemory>& grad_memory = {},
                            const std::function<void(int64_t step)>& on_window = {}) {
  const BucketPlan& plan = engine.plan();
  const int rank = engine.communicator().rank();
  RunResult out;
  for (int64_t step = 0; step < steps; ++step) {
    engine.start_window(step);
    if (on_window) on_window(step);
    std::vector<uint8_t> written(plan.params.size(), 0);
    for (int m = 0; m < micros; ++m) {
      auto active = active_groups(rank, step, m);
      engine.declare_active(active);
      if (m == micros - 1) engine.begin_sync();
      std::vector<int> order(plan.params.size());
      for (size_t p = 0; p < order.size(); ++p) order[p] = static_cast<int>(p);
      std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<uint32_t>(rank * 7919 + step * 31 + m)));
      for (int p : order) {
        if (!active[plan.params[p].group]) continue;
        std::vector<float> g(plan.params[p].numel);
        for (size_t i = 0; i < g.size(); ++i) g[i] = fake_grad(rank, step, m, p, i);
        if (!grad_memory.empty() && grad_memory[plan.params[p].group] == GradMemory::overwrite && !written[p])
          mem.write(engine.grad(p), g);
        else
          mem.accumulate(engine.grad(p), g);
        written[p] = 1;
        (void)engine.mark_ready(p);
      }
    }
    (void)engine.finish_backward();
    std::vector<std::vector<float>> grads;
    for (size_t p = 0; p < plan.params.size(); ++p) grads.push_back(mem.read(engine.grad(static_cast<int>(p)), plan.params[p].numel));
    out.grads.push_back(std::move(grads));
    out.stats.push_back(engine.stats());
  }
  return out;
}

// Compares a run with the reference; relative tolerance `rel` (0 = bitwise).
inline void expect_matches_reference(const RunResult& run, const BucketPlan& plan, int world, int micros,
                                     const EngineOptions& opts, double rel) {
  for (size_t step = 0; step < run.grads.size(); ++step) {
    Reference ref = reference(plan, world, static_cast<int64_t>(step), micros, opts.average);
    EXPECT_EQ(run.stats[step].contributors, ref.contributors) << "step " << step;
    // Bytes in the wire dtype: bf16 buckets carry exactly half of float32's.
    const int64_t wire = static_cast<int64_t>(dtype_size(opts.wire));
    const int64_t total = [&] {
      int64_t t = 0;
      for (const auto& p : plan.params) t += static_cast<int64_t>(wire * p.numel);
      return t;
    }();
    EXPECT_EQ(run.stats[step].bytes_allreduced, opts.prune ? ref.bytes_pruned_on / 4 * wire : total) << "step " << step;
    EXPECT_EQ(run.stats[step].bytes_allreduced + run.stats[step].bytes_pruned, total);
    for (size_t p = 0; p < plan.params.size(); ++p)
      for (size_t i = 0; i < plan.params[p].numel; ++i) {
        const int g = plan.params[p].group;
        // Overwrite groups that no rank used keep stale values (not reduced, never read).
        if (!opts.grad_memory.empty() && opts.grad_memory[g] == GradMemory::overwrite && ref.contributors[g] == 0)
          break;
        const float want = ref.grads[p][i], got = run.grads[step][p][i];
        if (rel == 0)
          ASSERT_EQ(got, want) << "step " << step << " param " << plan.params[p].name << " element " << i;
        else
          ASSERT_NEAR(got, want, rel * std::max(1.0f, std::abs(want)))
              << "step " << step << " param " << plan.params[p].name << " element " << i;
      }
  }
}

// Engine options of the tests: a 30 s timeout.
inline EngineOptions options(bool prune, Average avg) {
  EngineOptions o;
  o.prune = prune;
  o.average = avg;
  o.timeout = std::chrono::seconds(30);
  return o;
}

// The test model with every task parameter in a bucket of its own (streamed groups), small
// buckets for Θ.
inline BucketPlan streamed_plan() {
  std::vector<ParamInfo> params = model_params();
  for (ParamInfo& p : params) p.alone = p.group > 0;
  BucketPlanOptions po;
  po.bucket_cap_bytes = 200;
  po.first_bucket_bytes = 64;
  return make_bucket_plan(params, kGroups, po);
}

}  // namespace thetad::comm::testing
