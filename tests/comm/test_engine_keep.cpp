// Engine::keep (the replica rule's side in the engine), as real MPI processes (2, 3, 4 ranks): a
// group whose one contributor keeps its gradient sends nothing, that rank's buffer holds its own
// gradient exactly as a sent one would arrive (divided as sent, never rounded to bf16), a wrong
// guess of the keeper is sent as usual; prune on/off, average contributors/world, both wires,
// overwrite and pooled memory; the byte counts; the bandwidth timing; the refused calls.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "comm/backends.hpp"
#include "common/errors.hpp"
#include "engine_harness.hpp"

using namespace thetad::comm;
using namespace thetad::comm::testing;

namespace {

constexpr int kSteps = 16;

// The one rank that uses group g in window `step` (the harness's schedule), or -1.
int only_user(int world, int64_t step, int micros, int g) {
  int user = -1, users = 0;
  for (int r = 0; r < world; ++r) {
    bool used = false;
    for (int m = 0; m < micros; ++m) used = used || active_groups(r, step, m)[g];
    if (used) user = r, ++users;
  }
  return users == 1 ? user : -1;
}

// The keeper each window asks for: group 4's user (rank 0), and for groups 1..3 the one user if
// there is one, else a guess (rank step mod world) that the counts will overrule.
int guess(int world, int64_t step, int micros, int g) {
  if (g == 4) return 0;
  const int u = only_user(world, step, micros, g);
  return u >= 0 ? u : static_cast<int>(step % world);
}

struct Case {
  bool prune;
  Average average;
  DType wire;
  bool pooled;  // group 0 overwrite, the tasks pooled (as resident groups are held)
};

void run_case(const Case& c) {
  const int micros = 2;
  auto comm = make_mpi_communicator();
  const int world = comm->size(), rank = comm->rank();
  EngineOptions o = options(c.prune, c.average);
  o.wire = c.wire;
  if (c.pooled) {
    o.grad_memory.assign(kGroups, GradMemory::pooled);
    o.grad_memory[0] = GradMemory::overwrite;
  }
  Engine engine(comm, model_plan(), o);
  const BucketPlan& plan = engine.plan();
  const RunResult run = run_engine(engine, host_memory(), kSteps, micros, o.grad_memory, [&](int64_t step) {
    for (int g = 1; g <= 4; ++g) engine.keep(g, guess(world, step, micros, g));
  });
  int64_t kept_windows = 0, overruled = 0;
  for (int64_t step = 0; step < kSteps; ++step) {
    const StepStats& st = run.stats[static_cast<size_t>(step)];
    const Reference ref = reference(plan, world, step, micros, c.average);
    ASSERT_EQ(st.contributors, ref.contributors) << "step " << step;
    std::vector<int64_t> group_bytes(kGroups, 0);
    for (const Bucket& b : plan.buckets) group_bytes[b.group] += static_cast<int64_t>(b.numel * dtype_size(c.wire));
    int64_t sent = 0, kept = 0, total = 0;
    std::vector<int> keeper(kGroups, -1);
    for (int g = 0; g < kGroups; ++g) {
      total += group_bytes[g];
      const int user = only_user(world, step, micros, g);
      if (g >= 1 && g <= 4 && user >= 0 && user == guess(world, step, micros, g)) keeper[g] = user;
      if (keeper[g] >= 0) kept += group_bytes[g];
      else if (ref.contributors[g] > 0 || !c.prune) sent += group_bytes[g];
      if (g >= 1 && g <= 4 && ref.contributors[g] > 0 && keeper[g] < 0) ++overruled;
    }
    kept_windows += kept > 0;
    EXPECT_EQ(st.bytes_kept, kept) << "step " << step;
    EXPECT_EQ(st.bytes_allreduced, sent) << "step " << step;
    EXPECT_EQ(st.bytes_allreduced + st.bytes_pruned + st.bytes_kept, total) << "step " << step;
    // Every collective completed (the host waited): all of them timed, by kind.
    EXPECT_EQ(st.allreduce_time.count + st.broadcast_time.count, st.buckets_launched) << "step " << step;
    EXPECT_EQ(st.allreduce_time.bytes + st.broadcast_time.bytes, st.bytes_allreduced) << "step " << step;
    EXPECT_EQ(st.broadcast_time.count, st.buckets_broadcast) << "step " << step;
    if (st.buckets_launched > 0) {
      EXPECT_GT(st.allreduce_time.ms + st.broadcast_time.ms, 0.0) << "step " << step;
    }
    for (size_t p = 0; p < plan.params.size(); ++p) {
      const int g = plan.params[p].group;
      if (keeper[g] >= 0 && keeper[g] != rank) continue;  // not reduced here: the caller does not step it
      if (c.pooled && ref.contributors[g] == 0) continue;  // unused overwrite/pooled memory: unspecified
      // bf16 rounds what travels; a kept gradient never travels.
      const bool exact = c.wire == DType::f32 || keeper[g] >= 0;
      for (size_t i = 0; i < plan.params[p].numel; ++i) {
        const float want = ref.grads[p][i], got = run.grads[static_cast<size_t>(step)][p][i];
        if (exact) ASSERT_EQ(got, want) << "step " << step << " " << plan.params[p].name << "[" << i << "]";
        else ASSERT_NEAR(got, want, 2e-2 * std::max(1.0f, std::abs(want))) << "step " << step << " " << plan.params[p].name;
      }
    }
  }
  EXPECT_GT(kept_windows, kSteps / 3) << "group 4 alone is kept every other window";
  EXPECT_GT(overruled, 0) << "no guess was overruled: the test does not cover sending a guessed group";
}

class EngineKeep : public ::testing::TestWithParam<std::tuple<bool, Average, DType, bool>> {};

TEST_P(EngineKeep, KeptGroupsStayWithTheirContributorBitwise) {
  const auto [prune, average, wire, pooled] = GetParam();
  run_case({prune, average, wire, pooled});
}

INSTANTIATE_TEST_SUITE_P(Modes, EngineKeep,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(Average::contributors, Average::world),
                                            ::testing::Values(DType::f32, DType::bf16), ::testing::Bool()));

TEST(EngineKeep, KeptByIsAgreedOnEveryRank) {
  auto comm = make_mpi_communicator();
  Engine engine(comm, model_plan(), options(true, Average::contributors));
  engine.start_window(0);
  engine.keep(4, 0);                    // rank 0 alone uses group 4 at even steps
  engine.keep(5, comm->size() - 1);     // nobody uses group 5
  engine.declare_active(active_groups(comm->rank(), 0, 0));
  engine.begin_sync();
  EXPECT_EQ(engine.kept_by(4), 0);
  EXPECT_EQ(engine.kept_by(5), -1);
  EXPECT_EQ(engine.kept_by(0), -1);
  const auto& plan = engine.plan();
  for (size_t p = 0; p < plan.params.size(); ++p)
    if (active_groups(comm->rank(), 0, 0)[plan.params[p].group]) (void)engine.mark_ready(static_cast<int>(p));
  (void)engine.finish_backward();
  EXPECT_GT(engine.stats().buckets_kept, 0);
}

TEST(EngineKeep, RefusedCalls) {
  auto comm = make_mpi_communicator();
  EngineOptions o = options(true, Average::contributors);
  o.grad_memory.assign(kGroups, GradMemory::owned);
  o.grad_memory[5] = GradMemory::none;
  Engine engine(comm, model_plan(), o);
  engine.start_window(0);
  EXPECT_THROW(engine.keep(kGroups, 0), thetad::InternalError);
  EXPECT_THROW(engine.keep(1, comm->size()), thetad::InternalError);
  EXPECT_THROW(engine.keep(5, 0), thetad::InternalError);  // no gradient of the engine's own
  EXPECT_THROW(engine.kept_by(1), thetad::InternalError);  // before begin_sync
  engine.declare_active(std::vector<uint8_t>(kGroups, 0));
  engine.begin_sync();
  EXPECT_THROW(engine.keep(1, 0), thetad::InternalError);  // the order may be known already
  (void)engine.finish_backward();
}

}  // namespace
