// The engine's streamed groups (GradMemory::streamed: each task parameter in a bucket of its own,
// handed over by the caller) under mpirun: absent parameters hold up no later bucket, and the
// reduced values equal the reference bitwise.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>

#include "comm/bootstrap.hpp"
#include "common/errors.hpp"
#include "engine_harness.hpp"

using namespace thetad::comm;
using namespace thetad::comm::testing;
using namespace std::chrono_literals;

namespace {
constexpr int kSteps = 20;  // as test_engine.cpp
}  // namespace

TEST(Engine, AbsentStreamedParamsDoNotHoldUpLaterBuckets) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const BucketPlan plan = streamed_plan();
  EngineOptions o = options(true, Average::contributors);
  o.grad_memory.assign(kGroups, GradMemory::streamed);
  o.grad_memory[0] = GradMemory::owned;
  int launched = 0;
  std::vector<std::vector<float>> seen(plan.params.size());
  Engine* e = nullptr;
  // As Homes::take: where the host waits, each call hands back at most one streamed bucket, and
  // what became ready behind it is pulled once it is consumed.
  auto take = [&](const Launches& ls) {
    for (Launches more = ls; !more.empty(); more = e->launch_ready()) {
      int streamed = 0;
      for (const Launched& l : more) {
        ++launched;
        const Bucket& bucket = plan.buckets[static_cast<size_t>(l.bucket)];
        if (bucket.group == 0) continue;
        ++streamed;
        l.work->wait(30s);
        seen[static_cast<size_t>(bucket.params[0])].assign(l.data, l.data + bucket.numel);
      }
      EXPECT_LE(streamed, 1) << "streamed buckets handed back in one call";
    }
  };
  Engine engine(make_mpi_communicator(), plan, o);
  e = &engine;
  const int rank = engine.communicator().rank();
  const std::vector<uint8_t> all(kGroups, 1);
  auto absent = [&](int p, int r, int first) { return p != first && (p + r) % 3 == 0; };
  for (int64_t step = 0; step < 3; ++step) {
    engine.start_window(step);
    for (auto& v : seen) v.clear();
    launched = 0;
    engine.declare_active(all);
    engine.begin_sync();
    int first = -1;  // the first streamed parameter in backward order: handed over everywhere
    for (int p = static_cast<int>(plan.params.size()) - 1; p >= 0; --p) {
      const ParamInfo& info = plan.params[static_cast<size_t>(p)];
      std::vector<float> g(info.numel);
      for (size_t i = 0; i < g.size(); ++i) g[i] = fake_grad(rank, step, 0, p, i);
      if (info.group == 0) {
        std::copy(g.begin(), g.end(), engine.grad(p));
        take(engine.mark_ready(p));
        continue;
      }
      if (first < 0) first = p;
      if (absent(p, rank, first)) {
        take(engine.mark_absent(p));
        EXPECT_THROW((void)engine.mark_absent(p), thetad::InternalError);  // once per window
        continue;
      }
      auto mem = std::make_shared<std::vector<float>>(std::move(g));
      take(engine.mark_ready(p, mem->data(), mem));
    }
    EXPECT_EQ(launched, static_cast<int>(plan.buckets.size()))
        << "buckets waited for finish_backward at step " << step;
    take(engine.finish_backward());
    EXPECT_EQ(engine.stats().declared_without_grad, [&] {
      int n = 0;
      for (size_t p = 0; p < plan.params.size(); ++p)
        n += plan.params[p].group > 0 && absent(static_cast<int>(p), rank, first);
      return n;
    }());
    // Each streamed gradient: the sum over the ranks that had one, divided by the world (every
    // rank declared every group).
    for (size_t p = 0; p < plan.params.size(); ++p) {
      if (plan.params[p].group == 0) continue;
      ASSERT_EQ(seen[p].size(), plan.params[p].numel) << "param " << p;
      for (size_t i = 0; i < seen[p].size(); ++i) {
        double want = 0;
        for (int r = 0; r < world; ++r)
          if (!absent(static_cast<int>(p), r, first)) want += fake_grad(r, step, 0, static_cast<int>(p), i);
        want /= world;
        EXPECT_NEAR(seen[p][i], want, 1e-6 * (1 + std::abs(want))) << "param " << p << " element " << i;
      }
    }
  }
}

TEST(Engine, StreamedGroupsMatchTheReferenceBitwise) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const BucketPlan plan = streamed_plan();
  for (const Bucket& b : plan.buckets) {
    if (b.group > 0) {
      ASSERT_EQ(b.params.size(), 1u) << "bucket " << b.index;
    }
  }
  int64_t largest_streamed = 0;  // paced, the engine holds at most two streamed buckets at once
  for (const Bucket& b : plan.buckets)
    if (b.group > 0) largest_streamed = std::max<int64_t>(largest_streamed, static_cast<int64_t>(b.numel * sizeof(float)));
  for (bool prune : {true, false}) {
    EngineOptions o = options(prune, Average::contributors);
    o.grad_memory.assign(kGroups, GradMemory::streamed);
    o.grad_memory[0] = GradMemory::owned;
    std::vector<std::vector<float>> seen(plan.params.size());  // reduced values, from the launches handed back
    int live = 0;                                               // handed-over buffers not given back
    Engine engine(make_mpi_communicator(), plan, o);
    auto take = [&](const Launches& ls) {
      for (Launches more = ls; !more.empty(); more = engine.launch_ready())
        for (const Launched& l : more) {
          const Bucket& bucket = plan.buckets[static_cast<size_t>(l.bucket)];
          if (bucket.group == 0) continue;
          l.work->wait(30s);
          seen[static_cast<size_t>(bucket.params[0])].assign(l.data, l.data + bucket.numel);
        }
    };
    RunResult r;
    for (int64_t step = 0; step < kSteps; ++step) {
      engine.start_window(step);
      for (auto& v : seen) v.clear();
      const auto active = active_groups(engine.communicator().rank(), step, 0);
      engine.declare_active(active);
      engine.begin_sync();
      for (int p = static_cast<int>(plan.params.size()) - 1; p >= 0; --p) {
        const ParamInfo& info = plan.params[static_cast<size_t>(p)];
        if (!active[info.group]) continue;
        std::vector<float> g(info.numel);
        for (size_t i = 0; i < g.size(); ++i) g[i] = fake_grad(engine.communicator().rank(), step, 0, p, i);
        if (info.group == 0) {
          std::copy(g.begin(), g.end(), engine.grad(p));
          take(engine.mark_ready(p));
          continue;
        }
        EXPECT_THROW(engine.grad(p), thetad::InternalError);
        EXPECT_THROW((void)engine.mark_ready(p), thetad::InternalError);
        auto* mem = new std::vector<float>(std::move(g));
        ++live;
        std::shared_ptr<void> keep(mem, [&live](void* v) {
          --live;
          delete static_cast<std::vector<float>*>(v);
        });
        take(engine.mark_ready(p, mem->data(), std::move(keep)));
      }
      for (Launches rest = engine.launch_rest(); !rest.empty(); rest = engine.launch_rest()) take(rest);
      take(engine.finish_backward());
      EXPECT_EQ(live, 0) << "handed-over buffers still held after finish_backward, step " << step;
      EXPECT_LE(engine.stats().streamed_bytes_peak, 2 * largest_streamed) << "step " << step;
      std::vector<std::vector<float>> grads;
      for (size_t p = 0; p < plan.params.size(); ++p) {
        if (plan.params[p].group == 0) {
          const float* g = engine.grad(static_cast<int>(p));
          grads.emplace_back(g, g + plan.params[p].numel);
        } else {
          // Reduced (seen in the launches handed back) or pruned: a pruned group's gradient is zero.
          grads.push_back(seen[p].empty() ? std::vector<float>(plan.params[p].numel, 0.0f) : seen[p]);
        }
      }
      r.grads.push_back(std::move(grads));
      r.stats.push_back(engine.stats());
      if (engine.stats().contributors[1] > 0 || engine.stats().contributors[2] > 0) {
        EXPECT_GT(engine.stats().streamed_bytes_peak, 0);
      }
    }
    expect_matches_reference(r, plan, world, 1, o, 0.0);
  }
}
