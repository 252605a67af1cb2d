// The engine over the MPI backend, under mpirun with 2, 3 and 4 ranks: reduced gradients equal
// the locally computed reference for prune on/off x average contributors/world, prune on and off
// agree bitwise, bytes are exact, zero-filling, declared-mode errors and the launch order.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "comm/bootstrap.hpp"
#include "common/errors.hpp"
#include "engine_harness.hpp"

using namespace thetad::comm;
using namespace thetad::comm::testing;
using namespace std::chrono_literals;

namespace {

constexpr int kSteps = 20;


// Forwards to a real communicator and records which buckets were launched, in order.
class RecordingComm : public Communicator {
 public:
  explicit RecordingComm(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  MemoryKind memory_kind() const override { return inner_->memory_kind(); }
  const char* backend_name() const override { return inner_->backend_name(); }
  WorkPtr allreduce(void* buf, size_t count, DType dtype, const AllreduceOptions& opts) override {
    if (opts.tag.bucket >= 0) {
      std::lock_guard<std::mutex> lock(mu);
      launched.push_back(opts.tag.bucket);
    }
    return inner_->allreduce(buf, count, dtype, opts);
  }
  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root, const CollectiveTag& tag) override {
    return inner_->broadcast(buf, count, dtype, root, tag);
  }
  WorkPtr allgather(const void* send, void* recv, size_t count, DType dtype, const CollectiveTag& tag) override {
    return inner_->allgather(send, recv, count, dtype, tag);
  }
  WorkPtr reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                         const CollectiveTag& tag) override {
    return inner_->reduce_scatter(send, recv, count, dtype, op, tag);
  }
  WorkPtr exchange(const std::vector<PeerOp>& ops, const CollectiveTag& tag) override {
    return inner_->exchange(ops, tag);
  }
  WorkPtr barrier(const CollectiveTag& tag) override { return inner_->barrier(tag); }
  void abort(const std::string& why) override { inner_->abort(why); }
  std::shared_ptr<void> allocate(size_t bytes) override { return inner_->allocate(bytes); }
  void zero(void* ptr, size_t bytes) override { inner_->zero(ptr, bytes); }

  std::mutex mu;
  std::vector<int> launched;

 private:
  std::shared_ptr<Communicator> inner_;
};

RunResult run(bool prune, Average avg, int micros = 1) {
  Engine engine(make_mpi_communicator(), model_plan(), options(prune, avg));
  return run_engine(engine, host_memory(), kSteps, micros);
}

}  // namespace

class EngineEquivalence : public ::testing::TestWithParam<std::tuple<bool, Average>> {};

TEST_P(EngineEquivalence, MatchesReference) {
  const auto [prune, avg] = GetParam();
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  RunResult r = run(prune, avg);
  expect_matches_reference(r, model_plan(), world, 1, options(prune, avg), 0.0);
}

INSTANTIATE_TEST_SUITE_P(PruneAverage, EngineEquivalence,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(Average::contributors, Average::world)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "prune" : "noprune") + "_" +
                                  (std::get<1>(info.param) == Average::contributors ? "contributors" : "world");
                         });

// Buckets on a bf16 wire: the fake gradients are multiples of 1/8 in [-1, 1], so with a
// power-of-two world and average world every share and every partial sum is exact in bf16 and
// the result equals the float32 reference bit for bit; averaged over contributors (thirds) it is
// within bf16 rounding. Bytes are exactly half of float32's, step by step (checked against the
// reference's pruned bytes).
TEST(Engine, Bf16WireCarriesHalfTheBytes) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (Average avg : {Average::world, Average::contributors}) {
    for (bool prune : {true, false}) {
      EngineOptions o = options(prune, avg);
      o.wire = DType::bf16;
      Engine engine(make_mpi_communicator(), model_plan(), o);
      RunResult r = run_engine(engine, host_memory(), kSteps, 1);
      const bool exact = avg == Average::world && (world & (world - 1)) == 0;
      // Each addition rounds to bf16 (relative 2^-9), one per rank, on values up to 1.
      expect_matches_reference(r, model_plan(), world, 1, o, exact ? 0.0 : world * 0.004);
    }
  }
}

TEST(Engine, PruneOnAndOffAreBitwiseIdentical) {
  for (Average avg : {Average::contributors, Average::world}) {
    RunResult on = run(true, avg), off = run(false, avg);
    for (size_t s = 0; s < on.grads.size(); ++s)
      for (size_t p = 0; p < on.grads[s].size(); ++p)
        ASSERT_EQ(0, std::memcmp(on.grads[s][p].data(), off.grads[s][p].data(), on.grads[s][p].size() * 4))
            << "step " << s << " param " << p;
    // Pruning actually saved bytes: task 5 is never used.
    EXPECT_GT(on.stats[0].buckets_pruned, 0);
    EXPECT_EQ(off.stats[0].buckets_pruned, 0);
  }
}

TEST(Engine, GradientAccumulationReducesTheWindowUnion) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (bool prune : {true, false}) {
    RunResult r = run(prune, Average::contributors, 2);
    expect_matches_reference(r, model_plan(), world, 2, options(prune, Average::contributors), 0.0);
  }
}

TEST(Engine, GroupActiveOnlyOnAnotherRankIsZeroFilled) {
  auto comm = make_mpi_communicator();
  const int rank = comm->rank();
  const BucketPlan plan = model_plan();
  Engine engine(comm, plan, options(true, Average::contributors));
  engine.start_window(0);
  std::vector<uint8_t> active(kGroups, 0);
  active[2] = rank == 0;  // only rank 0 trains task 2
  engine.declare_active(active);
  engine.begin_sync();
  if (rank == 0)
    for (size_t p = 0; p < plan.params.size(); ++p)
      if (plan.params[p].group == 2) {
        for (size_t i = 0; i < plan.params[p].numel; ++i) engine.grad(static_cast<int>(p))[i] = 1.5f;
        (void)engine.mark_ready(static_cast<int>(p));
      }
  (void)engine.finish_backward();
  const StepStats& st = engine.stats();
  EXPECT_EQ(st.contributors[2], 1);
  EXPECT_EQ(st.buckets_launched, static_cast<int>(plan.group_buckets[2].size()));
  EXPECT_EQ(st.buckets_zero_filled, rank == 0 ? 0 : st.buckets_launched);
  for (size_t p = 0; p < plan.params.size(); ++p)
    for (size_t i = 0; i < plan.params[p].numel; ++i)
      ASSERT_EQ(engine.grad(static_cast<int>(p))[i], plan.params[p].group == 2 ? 1.5f : 0.0f);
  // The next window starts from zero everywhere, also where the reduction wrote.
  engine.start_window(1);
  engine.declare_active(std::vector<uint8_t>(kGroups, 0));
  engine.begin_sync();
  (void)engine.finish_backward();
  EXPECT_EQ(engine.stats().buckets_launched, 0);
  EXPECT_EQ(engine.stats().bytes_allreduced, 0);
  for (size_t p = 0; p < plan.params.size(); ++p) ASSERT_EQ(engine.grad(static_cast<int>(p))[0], 0.0f);
}

TEST(Engine, DeclaredInactiveGradientThrowsNamingTheParameter) {
  auto comm = make_mpi_communicator();
  const BucketPlan plan = model_plan();
  Engine engine(comm, plan, options(true, Average::contributors));
  engine.start_window(5);
  std::vector<uint8_t> active(kGroups, 0);
  active[0] = 1;
  engine.declare_active(active);
  engine.begin_sync();
  int p3 = -1;
  for (size_t p = 0; p < plan.params.size(); ++p)
    if (plan.params[p].group == 3) p3 = static_cast<int>(p);
  try {
    (void)engine.mark_ready(p3);
    FAIL() << "no error";
  } catch (const thetad::ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'" + plan.params[p3].name + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("group 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("step 5"), std::string::npos) << msg;
  }
  (void)engine.finish_backward();  // every rank still completes the window
  EXPECT_EQ(engine.stats().declared_without_grad, 5);  // the trunk's 5 params never came
}

TEST(Engine, LaunchOrderIsIndependentOfMarkOrder) {
  auto comm = std::make_shared<RecordingComm>(make_mpi_communicator());
  const int rank = comm->rank(), world = comm->size();
  const BucketPlan plan = model_plan();
  Engine engine(comm, plan, options(true, Average::contributors));
  for (int64_t step = 0; step < 6; ++step) {
    {
      std::lock_guard<std::mutex> lock(comm->mu);
      comm->launched.clear();
    }
    engine.start_window(step);
    auto active = active_groups(rank, step, 0);
    engine.declare_active(active);
    engine.begin_sync();
    if (step % 2 == 0) engine.contributors();  // counts landed: launches happen during "backward"
    // Marks from another thread, in an order that differs on every rank. Each call hands back
    // the buckets it launched: with finish_backward's, each bucket of the order exactly once.
    std::vector<int> handed_back;
    auto take = [&](const Launches& ls) {
      for (const Launched& l : ls) {
        EXPECT_TRUE(l.work != nullptr);
        EXPECT_EQ(l.data, engine.bucket_data(l.bucket));
        handed_back.push_back(l.bucket);
      }
    };
    std::thread hooks([&] {
      std::vector<int> order(plan.params.size());
      for (size_t p = 0; p < order.size(); ++p) order[p] = static_cast<int>(p);
      std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<uint32_t>(rank * 101 + step)));
      for (int p : order)
        if (active[plan.params[p].group]) take(engine.mark_ready(p));
    });
    hooks.join();
    int launched_before_finish = 0;
    {
      std::lock_guard<std::mutex> lock(comm->mu);
      launched_before_finish = static_cast<int>(comm->launched.size());
    }
    EXPECT_EQ(static_cast<int>(handed_back.size()), launched_before_finish) << "step " << step;
    take(engine.finish_backward());
    std::vector<int> expect;
    Reference ref = reference(plan, world, step, 1, Average::contributors);
    for (const Bucket& b : plan.buckets)
      if (ref.contributors[b.group] > 0) expect.push_back(b.index);
    EXPECT_EQ(comm->launched, expect) << "step " << step;
    EXPECT_EQ(handed_back, expect) << "step " << step;
    if (step % 2 == 0 && !expect.empty() && active[plan.buckets[expect[0]].group]) {
      EXPECT_GT(launched_before_finish, 0) << "no overlap: nothing launched before finish_backward";
    }
  }
}

TEST(Engine, StatsCountExchangeAndWait) {
  Engine engine(make_mpi_communicator(), model_plan(), options(true, Average::contributors));
  RunResult r = run_engine(engine, host_memory(), 2, 1);
  for (const StepStats& s : r.stats) {
    EXPECT_GE(s.count_exchange_ms, 0.0);
    EXPECT_GE(s.comm_wait_ms, 0.0);
    EXPECT_EQ(s.buckets_launched + s.buckets_pruned, static_cast<int>(engine.plan().buckets.size()));
  }
  EXPECT_EQ(r.stats[1].step, 1);
}

// Overwrite groups (gradients copied in on first arrival, DDP-style): no memset per window, yet
// the same reduced gradients bit for bit, over windows where groups move between ranks (stale
// buffers zero-filled), with and without pruning and with accumulation.
TEST(Engine, OverwriteGroupsMatchTheReferenceBitwise) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const BucketPlan plan = model_plan();
  for (bool prune : {true, false})
    for (int micros : {1, 2}) {
      EngineOptions o = options(prune, Average::contributors);
      o.grad_memory.assign(plan.num_groups, GradMemory::overwrite);
      Engine engine(make_mpi_communicator(), plan, o);
      RunResult r = run_engine(engine, host_memory(), kSteps, micros, o.grad_memory);
      expect_matches_reference(r, plan, world, micros, o, 0.0);
    }
}

// Buckets of a group that one rank used go as a broadcast from it (from 2 ranks here, so every
// world size of the suite takes that path): the same gradients bit for bit.
TEST(Engine, SingleContributorBucketsBroadcastBitwise) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const BucketPlan plan = model_plan();
  for (Average avg : {Average::contributors, Average::world})
    for (int min_ranks : {0, 2}) {
      EngineOptions o = options(true, avg);
      o.broadcast_min_ranks = min_ranks;
      Engine engine(make_mpi_communicator(), plan, o);
      RunResult r = run_engine(engine, host_memory(), kSteps, 1);
      expect_matches_reference(r, plan, world, 1, o, 0.0);
      int broadcast = 0;
      for (const StepStats& st : r.stats) broadcast += st.buckets_broadcast;
      if (min_ranks == 0) EXPECT_EQ(broadcast, 0);
      else EXPECT_GT(broadcast, 0) << "no group had exactly one contributor in " << kSteps << " steps";
    }
}

// A parameter of an active overwrite group that gets no gradient in a window contributes zeros,
// not the previous window's reduced values still in its buffer.
TEST(Engine, OverwriteZeroesWhatNoGradientWrote) {
  auto comm = make_mpi_communicator();
  const int world = comm->size();
  const BucketPlan plan = model_plan();
  EngineOptions o = options(true, Average::world);
  o.grad_memory.assign(plan.num_groups, GradMemory::overwrite);
  Engine engine(comm, plan, o);
  std::vector<int> params;  // of group 1
  for (size_t p = 0; p < plan.params.size(); ++p)
    if (plan.params[p].group == 1) params.push_back(static_cast<int>(p));
  ASSERT_GE(params.size(), 2u);
  std::vector<uint8_t> active(kGroups, 0);
  active[1] = 1;
  for (int window = 0; window < 2; ++window) {
    engine.start_window(window);
    engine.declare_active(active);
    engine.begin_sync();
    for (size_t k = 0; k < (window == 0 ? params.size() : 1); ++k) {
      const int p = params[k];
      std::fill(engine.grad(p), engine.grad(p) + plan.params[p].numel, 3.0f);
      (void)engine.mark_ready(p);
    }
    (void)engine.finish_backward();
  }
  EXPECT_EQ(engine.stats().declared_without_grad, static_cast<int>(params.size()) - 1);
  for (size_t k = 0; k < params.size(); ++k)
    for (size_t i = 0; i < plan.params[params[k]].numel; ++i)
      ASSERT_EQ(engine.grad(params[k])[i], k == 0 ? 3.0f : 0.0f) << "param " << k << " element " << i
                                                               << " (world " << world << ")";
}

// Pooled gradient buffers (the offloaded θ[t]): same results bit for bit, and the memory held
// follows the groups a window uses instead of all groups.
TEST(Engine, PooledGroupsMatchFixedBuffersBitwise) {
  const BucketPlan plan = model_plan();
  for (bool prune : {true, false}) {
    EngineOptions fixed_opts = options(prune, Average::contributors);
    EngineOptions pooled_opts = fixed_opts;
    pooled_opts.grad_memory.assign(plan.num_groups, GradMemory::pooled);
    pooled_opts.grad_memory[0] = GradMemory::owned;
    Engine fixed(make_mpi_communicator(), plan, fixed_opts);
    Engine pooled(make_mpi_communicator(), plan, pooled_opts);
    const size_t fixed_bytes = fixed.buffer_bytes();
    EXPECT_LT(pooled.buffer_bytes(), fixed_bytes);  // nothing bound yet: only Θ's buckets
    RunResult a = run_engine(fixed, host_memory(), kSteps, 1);
    RunResult b = run_engine(pooled, host_memory(), kSteps, 1);
    for (size_t s = 0; s < a.grads.size(); ++s)
      for (size_t p = 0; p < a.grads[s].size(); ++p)
        ASSERT_EQ(0, std::memcmp(a.grads[s][p].data(), b.grads[s][p].data(), a.grads[s][p].size() * 4))
            << "prune " << prune << " step " << s << " param " << p;
    expect_matches_reference(b, plan, pooled.communicator().size(), 1, pooled_opts, 0.0);
  }
}

// The per-group modes are checked against the plan: a caller's bug, so InternalError (exit 1).
TEST(Engine, GradMemoryNeedsOneModePerGroup) {
  const BucketPlan plan = model_plan();
  EngineOptions o = options(true, Average::contributors);
  o.grad_memory.assign(static_cast<size_t>(plan.num_groups) + 1, GradMemory::owned);
  try {
    Engine engine(make_mpi_communicator(), plan, o);
    FAIL() << "no error";
  } catch (const thetad::InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("one mode per group"), std::string::npos) << e.what();
    EXPECT_EQ(e.exit_code(), thetad::kExitOther);
  }
}

// Streamed groups (the row shards of offloaded output layers): each task parameter sits in a
// bucket of its own and is handed over in memory the caller owns; the engine reduces it there,
// the launches handed back see the reduced values, zero-filled buckets use scratch, and every handed-over
// buffer is given back by finish_backward. Same results as the reference, bit for bit.
// A parameter without elements (an empty tensor of a TorchScript model) has no bucket, but its
// gradient still has a valid address (a view of nothing), and marking it changes nothing.
TEST(Engine, ZeroElementParamsHaveAnAddressAndNoBucket) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::vector<ParamInfo> params = {{"a", 8, 0, false}, {"empty", 0, 0, false}, {"b", 4, 1, false}};
  const BucketPlan plan = make_bucket_plan(params, 2, BucketPlanOptions{});
  Engine engine(make_mpi_communicator(), plan, options(true, Average::world));
  const int rank = engine.communicator().rank();
  engine.start_window(0);
  engine.declare_active({1, 1});
  engine.begin_sync();
  EXPECT_NE(engine.grad(1), nullptr);
  for (int p : {2, 1, 0}) {
    float* g = engine.grad(p);
    for (size_t i = 0; i < params[static_cast<size_t>(p)].numel; ++i) g[i] = static_cast<float>(rank + 1);
    (void)engine.mark_ready(p);
  }
  (void)engine.finish_backward();
  const float want = static_cast<float>(world + 1) / 2.0f;  // mean of 1..world
  for (int p : {0, 2})
    for (size_t i = 0; i < params[static_cast<size_t>(p)].numel; ++i) EXPECT_FLOAT_EQ(engine.grad(p)[i], want);
  EXPECT_EQ(engine.stats().bytes_allreduced, static_cast<int64_t>((8 + 4) * sizeof(float)));
}

// A streamed parameter this rank has no gradient for (a shard without rows in the batch) is
// marked absent: its bucket reduces zeros from this rank, and the buckets after it launch during
// "backward", not at finish_backward. Every rank declares every group; rank r has no gradient
// for the streamed parameters p with (p + r) % 3 == 0, except the first one handed over.

// Adopted gradients (autograd's own tensors, nothing reduced) are for a world of one rank only;
// under mpirun this world has more, so the engine refuses the plan as a caller's bug. The world
// of one itself is tested end to end (equivalence_np1: the same bits as the reference).
TEST(Engine, AdoptedGradientsNeedAWorldOfOne) {
  const BucketPlan plan = model_plan();
  EngineOptions o = options(true, Average::contributors);
  o.grad_memory.assign(static_cast<size_t>(plan.num_groups), GradMemory::overwrite);
  o.grad_memory[1] = GradMemory::adopted;
  try {
    Engine engine(make_mpi_communicator(), plan, o);
    FAIL() << "no error";
  } catch (const thetad::InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("a world of one rank"), std::string::npos) << e.what();
  }
}

// The NCCL engine test's sequence over MPI: one communicator under engines of every option set in
// turn (overwrite buffers with single-contributor buckets broadcast, the bf16 wire with and without
// broadcasts): each engine's collectives must follow the previous one's in step on every rank.
TEST(Engine, EnginesInTurnOnOneCommunicatorStayInStep) {
  auto comm = make_mpi_communicator();
  const int world = comm->size();
  for (bool prune : {true, false})
    for (Average avg : {Average::contributors, Average::world})
      for (bool overwrite : {false, true}) {
        EngineOptions o = options(prune, avg);
        if (overwrite) o.grad_memory.assign(model_plan().num_groups, GradMemory::overwrite);
        o.broadcast_min_ranks = overwrite ? 2 : 0;
        Engine engine(comm, model_plan(), o);
        RunResult r = run_engine(engine, host_memory(), kSteps, 1, o.grad_memory);
        expect_matches_reference(r, model_plan(), world, 1, o, 0.0);
      }
  for (Average avg : {Average::world, Average::contributors})
    for (int broadcast_min_ranks : {0, 2}) {
      EngineOptions o = options(true, avg);
      o.wire = DType::bf16;
      o.broadcast_min_ranks = broadcast_min_ranks;
      Engine engine(comm, model_plan(), o);
      RunResult r = run_engine(engine, host_memory(), kSteps, 1);
      const bool exact = avg == Average::world && (world & (world - 1)) == 0;
      expect_matches_reference(r, model_plan(), world, 1, o, exact ? 0.0 : world * 0.004);
    }
}
