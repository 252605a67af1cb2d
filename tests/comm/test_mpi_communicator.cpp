// The MPI communicator and the bootstrap helpers, as real processes under mpirun (2 and 4 ranks).
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "comm/bf16.hpp"
#include "comm/bootstrap.hpp"
#include "comm/control_plane.hpp"
#include "comm/mpi/mpi_communicator.hpp"
#include "common/errors.hpp"

using namespace thetad::comm;
using namespace std::chrono_literals;

namespace {
constexpr std::chrono::milliseconds kWait = 30s;  // generous: oversubscribed CI cores
}

TEST(MpiCommunicator, WorldInfo) {
  WorldInfo w = world_info();
  auto comm = make_mpi_communicator();
  EXPECT_EQ(w.rank, comm->rank());
  EXPECT_EQ(w.size, comm->size());
  EXPECT_EQ(w.local_size, w.size);  // all on one host in CI
  EXPECT_EQ(w.local_rank, w.rank);
  EXPECT_EQ(comm->memory_kind(), MemoryKind::host);
  EXPECT_STREQ(comm->backend_name(), "mpi");
}

TEST(MpiCommunicator, AllreduceFloatWithDivisor) {
  auto comm = make_mpi_communicator();
  const int r = comm->rank(), n = comm->size();
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(r + 1) * static_cast<float>(i);
  AllreduceOptions o;
  o.divisor = n;
  o.tag = {"allreduce", 1, 0};
  comm->allreduce(v.data(), v.size(), DType::f32, o)->wait(kWait);
  const float ranks_sum = n * (n + 1) / 2.0f;
  for (size_t i = 0; i < v.size(); ++i)
    ASSERT_FLOAT_EQ(v[i], static_cast<float>(ranks_sum * i / static_cast<double>(n))) << i;
}

TEST(MpiCommunicator, AllreduceInt32SumMaxAndDivisor) {
  auto comm = make_mpi_communicator();
  const int r = comm->rank(), n = comm->size();
  std::vector<int32_t> a = {r, 1, 10 * r, -r};
  comm->allreduce(a.data(), a.size(), DType::i32, {})->wait(kWait);
  EXPECT_EQ(a, (std::vector<int32_t>{n * (n - 1) / 2, n, 10 * n * (n - 1) / 2, -n * (n - 1) / 2}));
  std::vector<int32_t> m = {r, -r};
  AllreduceOptions mo;
  mo.op = ReduceOp::max;
  comm->allreduce(m.data(), m.size(), DType::i32, mo)->wait(kWait);
  EXPECT_EQ(m, (std::vector<int32_t>{n - 1, 0}));
  std::vector<int32_t> d = {4, 6};
  AllreduceOptions dopt;
  dopt.divisor = 2;
  comm->allreduce(d.data(), d.size(), DType::i32, dopt)->wait(kWait);
  EXPECT_EQ(d, (std::vector<int32_t>{2 * n, 3 * n}));
}

TEST(MpiCommunicator, AllreduceBf16) {
  auto comm = make_mpi_communicator();
  const int n = comm->size();
  // bf16 of 1.0 and 0.5 (exact), summed over ranks then divided by the world size.
  std::vector<uint16_t> v = {0x3f80, 0x3f00};
  AllreduceOptions o;
  o.divisor = n;
  comm->allreduce(v.data(), v.size(), DType::bf16, o)->wait(kWait);
  EXPECT_EQ(v[0], 0x3f80);
  EXPECT_EQ(v[1], 0x3f00);
}

// A float32 sum sent as bf16: each rank's share is divided first (rounded to bf16), the sum is
// rounded at each addition, the result lands as float32. 1e38 per rank would overflow a bf16 (and
// a float) sum of 4 ranks before the division; divided first it does not.
TEST(MpiCommunicator, AllreduceFloatOnABf16Wire) {
  auto comm = make_mpi_communicator();
  const int r = comm->rank(), n = comm->size();
  std::vector<float> v = {1.0f, 1e38f, 3.14159f * static_cast<float>(r + 1), 0.0f};
  AllreduceOptions o;
  o.divisor = n;
  o.bf16_wire = true;
  comm->allreduce(v.data(), v.size(), DType::f32, o)->wait(kWait);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_TRUE(std::isfinite(v[1]));
  EXPECT_NEAR(v[1], 1e38, 1e38 * 0.01);
  // The expected value, rounded as the wire rounds (in rank order: with one commutative addition
  // per pair the order cannot matter for 2 ranks; for more, allow one bf16 ulp per addition).
  const float f = static_cast<float>(1.0 / n);
  float sum = bf16_to_float(float_to_bf16(3.14159f * f));
  for (int k = 2; k <= n; ++k)
    sum = bf16_to_float(float_to_bf16(sum + bf16_to_float(float_to_bf16(3.14159f * static_cast<float>(k) * f))));
  if (n == 2) EXPECT_EQ(v[2], sum);
  else EXPECT_NEAR(v[2], sum, std::abs(sum) * (n - 1) * 0.0079);
  EXPECT_NE(v[2], 3.14159f * (n + 1) / 2.0f) << "the value did not go through bf16";
  EXPECT_EQ(v[3], 0.0f);
  // From one root: its rounded share, the same on every rank.
  std::vector<float> b = {r == 0 ? 3.14159f : 0.0f};
  o.from_root = 0;
  comm->allreduce(b.data(), b.size(), DType::f32, o)->wait(kWait);
  EXPECT_EQ(b[0], bf16_to_float(float_to_bf16(3.14159f * f)));
  // Only float32 sums can travel as bf16.
  std::vector<int32_t> i = {1};
  AllreduceOptions bad;
  bad.bf16_wire = true;
  EXPECT_THROW(comm->allreduce(i.data(), 1, DType::i32, bad), thetad::InternalError);
}

TEST(MpiCommunicator, Broadcast) {
  auto comm = make_mpi_communicator();
  const int root = comm->size() - 1;
  std::vector<float> v(17, static_cast<float>(comm->rank()));
  comm->broadcast(v.data(), v.size(), DType::f32, root, {})->wait(kWait);
  for (float x : v) EXPECT_EQ(x, static_cast<float>(root));
}

TEST(MpiCommunicator, Allgather) {
  auto comm = make_mpi_communicator();
  const int n = comm->size();
  std::vector<int32_t> send = {comm->rank(), 100 + comm->rank()};
  std::vector<int32_t> recv(2 * n, -1);
  comm->allgather(send.data(), recv.data(), 2, DType::i32, {})->wait(kWait);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(recv[2 * r], r);
    EXPECT_EQ(recv[2 * r + 1], 100 + r);
  }
}

TEST(MpiCommunicator, Barrier) {
  auto comm = make_mpi_communicator();
  auto w = comm->barrier({"barrier", 3, -1});
  w->wait(kWait);
  EXPECT_TRUE(w->is_completed());
  EXPECT_GE(w->elapsed_ms(), 0.0);
}

TEST(MpiCommunicator, ManyConcurrentAllreducesComplete) {
  auto comm = make_mpi_communicator();
  const int n = comm->size();
  constexpr int kBuckets = 64;
  std::vector<std::shared_ptr<void>> bufs;
  std::vector<WorkPtr> works;
  for (int b = 0; b < kBuckets; ++b) {
    const size_t count = 1 + 997 * b;
    bufs.push_back(comm->allocate(count * sizeof(float)));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(bufs.back().get()) % 64, 0u);
    auto* p = static_cast<float*>(bufs.back().get());
    for (size_t i = 0; i < count; ++i) p[i] = static_cast<float>(b + comm->rank());
    AllreduceOptions o;
    o.tag = {"allreduce", 0, b};
    works.push_back(comm->allreduce(p, count, DType::f32, o));
  }
  for (int b = kBuckets - 1; b >= 0; --b) works[b]->wait(kWait);  // any order of waiting
  for (int b = 0; b < kBuckets; ++b) {
    auto* p = static_cast<float*>(bufs[b].get());
    const float expect = static_cast<float>(n * b + n * (n - 1) / 2);
    EXPECT_EQ(p[0], expect);
    EXPECT_EQ(p[997 * b], expect);
  }
}

TEST(MpiCommunicator, AllocateIsZeroedAndZeroClears) {
  auto comm = make_mpi_communicator();
  auto buf = comm->allocate(1000);
  auto* p = static_cast<unsigned char*>(buf.get());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(p[i], 0);
  std::memset(p, 7, 1000);
  comm->zero(p, 1000);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(p[i], 0);
}

TEST(MpiCommunicator, AbortFailsPendingAndLaterWork) {
  auto comm = make_mpi_communicator();
  comm->barrier({})->wait(kWait);
  comm->abort("test");
  std::vector<float> v(4, 1.0f);
  auto w = comm->allreduce(v.data(), v.size(), DType::f32, {});
  EXPECT_THROW(w->wait(kWait), thetad::CommError);
}

TEST(MpiCommunicator, CollectiveTagDescribe) {
  EXPECT_EQ((CollectiveTag{"allreduce", 17, 3}).describe(), "allreduce of bucket 3 at step 17");
  EXPECT_EQ((CollectiveTag{"count exchange", 2, -1}).describe(), "count exchange at step 2");
  EXPECT_EQ(CollectiveTag{}.describe(), "collective");
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_STREQ(dtype_name(DType::f32), "float32");
}

TEST(MpiCommunicator, CollectivesAreNumberedInLaunchOrder) {
  auto comm = make_mpi_communicator();
  std::vector<float> v(4, 1.0f);
  auto a = comm->barrier({});
  auto b = comm->allreduce(v.data(), v.size(), DType::f32, {});
  auto c = comm->broadcast(v.data(), v.size(), DType::f32, 0, {"weights", 4, -1});
  EXPECT_EQ(a->sequence(), 1u);
  EXPECT_EQ(b->sequence(), 2u);
  EXPECT_EQ(c->sequence(), 3u);
  for (auto* w : {&a, &b, &c}) (*w)->wait(kWait);
}

TEST(MpiCommunicator, DescribeCollectiveAndTimeoutMessageCarryTheNumber) {
  const CollectiveTag tag{"allreduce", 17, 3};
  EXPECT_EQ(describe_collective(12, tag), "collective #12 (allreduce of bucket 3 at step 17)");
  EXPECT_EQ(describe_collective(0, tag), "allreduce of bucket 3 at step 17");  // unnumbered
  EXPECT_EQ(timeout_message(12, tag, 2s), "collective #12 (allreduce of bucket 3 at step 17) did not finish within 2 s");
  EXPECT_EQ(timeout_message(5, {"count exchange", 70, -1}, 500ms),
            "collective #5 (count exchange at step 70) did not finish within 0.5 s");
  EXPECT_EQ((named({}, "barrier")).what, "barrier");
  EXPECT_EQ((named({"weights", 1, -1}, "broadcast")).what, "weights");
}

ControlPlane& plane() {
  static ControlPlane p(make_mpi_communicator(), kWait);
  return p;
}

TEST(Bootstrap, CheckConsistentPassesOnIdenticalText) {
  EXPECT_NO_THROW(plane().check_consistent("job", "job=x\noptimizer.lr=0.001\nseed=1\n"));
}

TEST(Bootstrap, CheckConsistentNamesTheDifferingLine) {
  WorldInfo w = world_info();
  const std::string lr = w.rank == 1 ? "0.002" : "0.001";
  try {
    plane().check_consistent("job", "job=x\noptimizer.lr=" + lr + "\nseed=1\n");
    FAIL() << "no error";
  } catch (const thetad::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "job differs across ranks: rank 1 has 'optimizer.lr=0.002' where rank 0 has "
              "'optimizer.lr=0.001'");
    EXPECT_EQ(e.exit_code(), thetad::kExitBadInput);
  }
}

TEST(Bootstrap, CheckConsistentExtraLine) {
  WorldInfo w = world_info();
  std::string text = "a=1\n";
  if (w.rank == w.size - 1) text += "b=2\n";
  try {
    plane().check_consistent("plan", text);
    FAIL() << "no error";
  } catch (const thetad::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("plan differs across ranks: rank " + std::to_string(w.size - 1) +
                                         " has 'b=2'"),
              std::string::npos)
        << e.what();
  }
}

TEST(ControlPlane, AllOkAndBroadcast) {
  WorldInfo w = world_info();
  EXPECT_TRUE(plane().all_ok(true, {"all ok"}));
  EXPECT_FALSE(plane().all_ok(w.rank != w.size - 1, {"one fails"}));
  EXPECT_EQ(plane().broadcast(int64_t{w.rank == 0 ? 1234567890123 : -1}, 0, {"value"}), 1234567890123);
  EXPECT_EQ(plane().broadcast(w.rank == w.size - 1 ? std::string("from the last") : std::string(), w.size - 1,
                              {"text"}),
            "from the last");
  plane().barrier({"barrier"});
}

TEST(ControlPlane, AgreeThrowsTheFailingRanksErrorEverywhere) {
  WorldInfo w = world_info();
  plane().agree(nullptr, {"nothing failed"});
  std::exception_ptr mine;
  if (w.rank == w.size - 1) mine = std::make_exception_ptr(thetad::ConfigError("bad file x"));
  try {
    plane().agree(mine, {"reading", 7});
    FAIL() << "no error";
  } catch (const thetad::ConfigError& e) {
    if (w.rank == w.size - 1)
      EXPECT_EQ(std::string(e.what()), "bad file x");
    else
      EXPECT_EQ(std::string(e.what()), "reading at step 7 failed on rank " + std::to_string(w.size - 1) + ": bad file x");
  }
}

TEST(ControlPlane, RunOnRootAndAnyFlag) {
  WorldInfo w = world_info();
  EXPECT_EQ(plane().run_on_root(0, {"root value"}, [] { return int64_t{42}; }), 42);
  EXPECT_THROW(plane().run_on_root(0, {"root fails"}, []() -> int64_t { throw thetad::CommError("gone"); }),
               thetad::CommError);
  auto none = plane().post_any(false, {"stop flag"});
  EXPECT_FALSE(none.get());
  auto one = plane().post_any(w.rank == 0, {"stop flag"});
  EXPECT_TRUE(one.pending());
  EXPECT_TRUE(one.get());
  EXPECT_FALSE(one.get());  // read once
}

TEST(Bootstrap, MpiCheckCarriesTheMpiErrorString) {
  try {
    MPI_CHECK(MPI_ERR_COUNT);  // what a failed MPI call returns
    FAIL() << "no error";
  } catch (const thetad::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("MPI error in "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("MPI_ERR_COUNT"), std::string::npos) << e.what();
  }
}

// A world of one (a communicator over MPI_COMM_SELF on each rank): every collective is computed
// where it is called and returned complete, with the same results as the progress thread's path.
TEST(MpiCommunicator, AWorldOfOneCompletesWhereCalled) {
  MpiCommunicator self(MPI_COMM_SELF);
  ASSERT_EQ(self.size(), 1);
  std::vector<float> v = {2.0f, -6.0f, 3.14159f};
  AllreduceOptions o;
  o.divisor = 4;
  WorkPtr w = self.allreduce(v.data(), v.size(), DType::f32, o);
  EXPECT_TRUE(w->is_completed());
  EXPECT_EQ(w->sequence(), 1u);  // numbered as on any world (timeout and error messages name it)
  EXPECT_EQ(v, (std::vector<float>{0.5f, -1.5f, 3.14159f / 4}));
  o.divisor = 1;
  o.bf16_wire = true;  // still rounded as the wire rounds
  self.allreduce(v.data(), v.size(), DType::f32, o)->wait(kWait);
  EXPECT_EQ(v[2], bf16_to_float(float_to_bf16(3.14159f / 4)));
  std::vector<int32_t> m = {7, -3};
  AllreduceOptions mx;
  mx.op = ReduceOp::max;
  EXPECT_TRUE(self.allreduce(m.data(), m.size(), DType::i32, mx)->is_completed());
  EXPECT_EQ(m, (std::vector<int32_t>{7, -3}));
  const std::vector<int64_t> send = {11, 12, 13};
  std::vector<int64_t> recv(3, 0);
  EXPECT_TRUE(self.allgather(send.data(), recv.data(), send.size(), DType::i64, {"gather", 0, -1})->is_completed());
  EXPECT_EQ(recv, send);
  EXPECT_TRUE(self.broadcast(recv.data(), recv.size(), DType::i64, 0, {"bcast", 0, -1})->is_completed());
  EXPECT_EQ(recv, send);
  EXPECT_TRUE(self.barrier({"barrier", 0, -1})->is_completed());
  EXPECT_THROW(self.broadcast(recv.data(), 1, DType::i64, 1, {"bcast", 0, -1}), thetad::InternalError);
  // Aborted, a world of one fails its collectives as any other world does.
  self.abort("a test aborts");
  EXPECT_THROW(self.allreduce(v.data(), v.size(), DType::f32, o)->wait(kWait), thetad::CommError);
  EXPECT_THROW(self.barrier({"barrier", 0, -1})->wait(kWait), thetad::CommError);
}
