// The MPI communicator's send/recv (Communicator::exchange) and reduce-scatter, as real processes
// under mpirun (2 and 4 ranks): a ring in both directions in one exchange, several messages between
// one pair matched in posting order, every dtype, a star of sends, the errors that start nothing,
// the operations' numbers and times, and a world of one.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "comm/backends.hpp"
#include "comm/bf16.hpp"
#include "comm/mpi/mpi_communicator.hpp"
#include "common/errors.hpp"

using namespace thetad::comm;
using namespace std::chrono_literals;

namespace {

constexpr std::chrono::milliseconds kWait = 30s;

std::vector<float> values_of(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(rank) * 1000.0f + static_cast<float>(i) * 0.5f;
  return v;
}

}  // namespace

// Each rank sends to the next and receives from the previous in one exchange: both directions of
// every link at once (what a blocking send would deadlock on), and the work completes as one.
TEST(PeerOps, RingInOneExchange) {
  auto comm = make_mpi_communicator();
  const int r = comm->rank(), n = comm->size();
  const std::vector<float> out = values_of(r, 1000);
  std::vector<float> in(out.size(), -1.0f);
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  WorkPtr w = comm->exchange({send_op(out.data(), out.size(), DType::f32, next),
                              recv_op(in.data(), in.size(), DType::f32, prev)},
                             {"ring", 3, -1});
  w->wait(kWait);
  EXPECT_TRUE(w->is_completed());
  EXPECT_GE(w->elapsed_ms(), 0.0);
  EXPECT_EQ(in, values_of(prev, 1000));
}

// Between one pair, messages match in the order both post them, whatever their dtype or size;
// a single send and recv (the helpers) too.
TEST(PeerOps, MessagesOfAPairMatchInOrder) {
  auto comm = make_mpi_communicator();
  const int r = comm->rank(), n = comm->size();
  const int peer = r ^ 1;
  if (peer >= n) GTEST_SKIP() << "an odd rank count leaves rank " << r << " without a partner";
  const std::vector<float> a = values_of(r, 7);
  const std::vector<int64_t> b = {r * 10LL, -r * 10LL - 1, int64_t{1} << 40};
  const std::vector<uint16_t> c = {float_to_bf16(1.5f + r), float_to_bf16(-2.0f)};
  const std::vector<uint8_t> d = {static_cast<uint8_t>(r), 255};
  std::vector<float> a_in(a.size());
  std::vector<int64_t> b_in(b.size());
  std::vector<uint16_t> c_in(c.size());
  std::vector<uint8_t> d_in(d.size());
  // Sends first on one side, receives first on the other: order within an exchange is free.
  std::vector<PeerOp> ops = {send_op(a.data(), a.size(), DType::f32, peer), send_op(b.data(), b.size(), DType::i64, peer),
                             send_op(c.data(), c.size(), DType::bf16, peer),
                             recv_op(a_in.data(), a_in.size(), DType::f32, peer),
                             recv_op(b_in.data(), b_in.size(), DType::i64, peer),
                             recv_op(c_in.data(), c_in.size(), DType::bf16, peer)};
  if (r % 2) std::rotate(ops.begin(), ops.begin() + 3, ops.end());
  comm->exchange(ops, {"pair", -1, -1})->wait(kWait);
  EXPECT_EQ(a_in, values_of(peer, 7));
  EXPECT_EQ(b_in, (std::vector<int64_t>{peer * 10LL, -peer * 10LL - 1, int64_t{1} << 40}));
  EXPECT_EQ(c_in, (std::vector<uint16_t>{float_to_bf16(1.5f + peer), float_to_bf16(-2.0f)}));
  // Two separate exchanges per direction: matched in posting order too.
  WorkPtr first = r % 2 ? comm->recv(d_in.data(), d_in.size(), DType::u8, peer, {"first", -1, -1})
                        : comm->send(d.data(), d.size(), DType::u8, peer, {"first", -1, -1});
  std::vector<uint8_t> e = {9}, e_in = {0};
  WorkPtr second = r % 2 ? comm->recv(e_in.data(), 1, DType::u8, peer, {"second", -1, -1})
                         : comm->send(e.data(), 1, DType::u8, peer, {"second", -1, -1});
  first->wait(kWait);
  second->wait(kWait);
  if (r % 2) {
    EXPECT_EQ(d_in, (std::vector<uint8_t>{static_cast<uint8_t>(peer), 255}));
    EXPECT_EQ(e_in, std::vector<uint8_t>{9});
  }
}

// Rank 0 sends to every other rank; ranks not named by an exchange take no part in it.
TEST(PeerOps, StarFromOneRankAndCollectivesAround) {
  auto comm = make_mpi_communicator();
  const int r = comm->rank(), n = comm->size();
  std::vector<float> buf = r == 0 ? values_of(0, 64) : std::vector<float>(64, 0.0f);
  std::vector<float> sum = {1.0f};
  WorkPtr before = comm->allreduce(sum.data(), 1, DType::f32, {});
  if (r == 0) {
    std::vector<PeerOp> ops;
    for (int p = 1; p < n; ++p) ops.push_back(send_op(buf.data(), buf.size(), DType::f32, p));
    comm->exchange(ops, {"star", -1, -1})->wait(kWait);
  } else {
    comm->recv(buf.data(), buf.size(), DType::f32, 0, {"star", -1, -1})->wait(kWait);
  }
  before->wait(kWait);
  comm->barrier({})->wait(kWait);
  EXPECT_EQ(buf, values_of(0, 64));
  EXPECT_EQ(sum[0], static_cast<float>(n));
  // An exchange of nothing is complete, and numbered.
  WorkPtr none = comm->exchange({}, {"nothing", -1, -1});
  none->wait(kWait);
  EXPECT_GT(none->sequence(), 0u);
}

// A peer that is not another rank, or a missing buffer, is refused before anything is posted
// (the other ranks are not left waiting), naming the operation.
TEST(PeerOps, BadPeersAreRefusedNamingTheTransfer) {
  auto comm = make_mpi_communicator();
  const int r = comm->rank(), n = comm->size();
  float x = 0;
  for (int peer : {r, -1, n}) {
    try {
      comm->send(&x, 1, DType::f32, peer, {"state of group 3", 5, -1});
      FAIL() << "peer " << peer << " accepted";
    } catch (const thetad::InternalError& e) {
      EXPECT_NE(std::string(e.what()).find("state of group 3 at step 5: peer " + std::to_string(peer)),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(comm->recv(nullptr, 4, DType::f32, (r + 1) % n, {}), thetad::InternalError);
  comm->barrier({})->wait(kWait);  // nothing was started
}

TEST(ReduceScatter, SumMaxAndBf16) {
  auto comm = make_mpi_communicator();
  const int r = comm->rank(), n = comm->size();
  const size_t count = 5;
  std::vector<float> send(n * count);
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>(i) + 0.25f * static_cast<float>(r);
  std::vector<float> recv(count, -1.0f);
  WorkPtr w = comm->reduce_scatter(send.data(), recv.data(), count, DType::f32, ReduceOp::sum, {"rs", 1, -1});
  w->wait(kWait);
  const float ranks = 0.25f * static_cast<float>(n * (n - 1) / 2);
  for (size_t i = 0; i < count; ++i) EXPECT_EQ(recv[i], n * static_cast<float>(r * count + i) + ranks) << i;
  std::vector<int32_t> isend(n * 2), irecv(2);
  for (int b = 0; b < n; ++b) isend[2 * b] = r * 100 + b, isend[2 * b + 1] = -r;
  comm->reduce_scatter(isend.data(), irecv.data(), 2, DType::i32, ReduceOp::max, {})->wait(kWait);
  EXPECT_EQ(irecv, (std::vector<int32_t>{(n - 1) * 100 + r, 0}));
  std::vector<uint16_t> bsend(n, float_to_bf16(0.5f)), brecv(1);
  comm->reduce_scatter(bsend.data(), brecv.data(), 1, DType::bf16, ReduceOp::sum, {})->wait(kWait);
  EXPECT_EQ(bf16_to_float(brecv[0]), 0.5f * n);
}

TEST(ReduceScatter, AWorldOfOneAndItsExchanges) {
  MpiCommunicator self(MPI_COMM_SELF);
  const std::vector<float> send = {1.0f, 2.0f};
  std::vector<float> recv(2);
  EXPECT_TRUE(self.reduce_scatter(send.data(), recv.data(), 2, DType::f32, ReduceOp::sum, {})->is_completed());
  EXPECT_EQ(recv, send);
  EXPECT_TRUE(self.exchange({}, {})->is_completed());
  EXPECT_THROW(self.send(send.data(), 2, DType::f32, 0, {}), thetad::InternalError);  // no other rank
}
