// The engine over NCCL (label gpu, 2 ranks on 2 GPUs): the same reference check as the MPI
// engine tests, device buffers, plus the basic collectives. Skips without a GPU per rank of a
// node. Run as 2 simulated nodes too (test_comm_nccl_2nodes): NCCL's network transport, and a
// GPU per node is enough (the nodes may share one).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "comm/bootstrap.hpp"
#include "comm/control_plane.hpp"
#include "common/errors.hpp"
#include "engine_harness.hpp"

using namespace thetad::comm;
using namespace thetad::comm::testing;
using namespace std::chrono_literals;

namespace {

// One GPU per rank of a node (NCCL refuses two ranks of one host on one device). Every rank must
// agree on skipping, or the others would wait in a collective forever.
bool gpus_available() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n >= world_info().local_size;
  int local = ok ? 1 : 0, all = 0;
  MPI_CHECK(MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  return all == 1;
}

std::shared_ptr<Communicator> nccl() {
  WorldInfo w = world_info();
  int n = 0;
  cudaGetDeviceCount(&n);
  ControlPlane plane(make_mpi_communicator());  // the unique id's exchange
  return make_nccl_communicator(w.local_rank % n, plane);
}

Memory device_memory() {
  // cudaMemcpy runs on the legacy default stream, the communicator's compute stream here.
  return {[](float* dst, const std::vector<float>& add) {
            std::vector<float> cur(add.size());
            cudaMemcpy(cur.data(), dst, add.size() * 4, cudaMemcpyDeviceToHost);
            for (size_t i = 0; i < add.size(); ++i) cur[i] += add[i];
            cudaMemcpy(dst, cur.data(), add.size() * 4, cudaMemcpyHostToDevice);
          },
          [](const float* src, size_t n) {
            std::vector<float> out(n);
            cudaMemcpy(out.data(), src, n * 4, cudaMemcpyDeviceToHost);
            return out;
          },
          [](float* dst, const std::vector<float>& v) {
            cudaMemcpy(dst, v.data(), v.size() * 4, cudaMemcpyHostToDevice);
          }};
}

}  // namespace

TEST(Nccl, Collectives) {
  if (!gpus_available()) GTEST_SKIP() << "fewer GPUs than ranks on this host";
  auto comm = nccl();
  const int r = comm->rank(), n = comm->size();
  auto buf = comm->allocate(4 * 1024);
  std::vector<float> h(1024, static_cast<float>(r + 1));
  cudaMemcpy(buf.get(), h.data(), 4096, cudaMemcpyHostToDevice);
  AllreduceOptions o;
  o.divisor = n;
  comm->allreduce(buf.get(), 1024, DType::f32, o)->wait(30s);
  cudaMemcpy(h.data(), buf.get(), 4096, cudaMemcpyDeviceToHost);
  EXPECT_FLOAT_EQ(h[7], (n + 1) / 2.0f);
  comm->barrier({})->wait(30s);
  std::vector<int32_t> x = {r};
  comm->copy_from_host(buf.get(), x.data(), 4);
  comm->broadcast(buf.get(), 1, DType::i32, n - 1, {})->wait(30s);
  comm->copy_to_host(x.data(), buf.get(), 4);
  EXPECT_EQ(x[0], n - 1);
}

TEST(Nccl, EngineMatchesReference) {
  if (!gpus_available()) GTEST_SKIP() << "fewer GPUs than ranks on this host";
  auto comm = nccl();
  const int world = comm->size();
  for (bool prune : {true, false})
    for (Average avg : {Average::contributors, Average::world})
      for (bool overwrite : {false, true}) {
      EngineOptions o;
      o.prune = prune;
      o.average = avg;
      o.timeout = 60s;
      if (overwrite) o.grad_memory.assign(model_plan().num_groups, GradMemory::overwrite);  // gradients copied in
      // With overwrite, single-contributor buckets also go as broadcasts (root scales first).
      o.broadcast_min_ranks = overwrite ? 2 : 0;
      Engine engine(comm, model_plan(), o);
      RunResult r = run_engine(engine, device_memory(), 20, 1, o.grad_memory);
      // PreMulSum multiplies by 1/divisor before summing: equal within float32 rounding.
      expect_matches_reference(r, model_plan(), world, 1, o, 1e-6);
    }
}

// copy_from_host takes its source on return: the count exchange's flags are a vector freed at
// once, its heap reused by the next gradients; a copy that read it later (a cudaMemcpyAsync from
// pageable memory may) sent those instead, and the ranks then launched different collectives.
TEST(Nccl, ControlCopyTakesItsSourceOnReturn) {
  if (!gpus_available()) GTEST_SKIP() << "fewer GPUs than ranks on this host";
  auto comm = nccl();
  const int r = comm->rank(), n = comm->size();
  const size_t count = size_t{1} << 16;  // 256 KiB: a copy still reading would see the overwrite
  auto buf = comm->allocate(count * sizeof(int32_t));
  for (int round = 0; round < 20; ++round) {
    {
      std::vector<int32_t> src(count, r * 1000 + round);
      comm->copy_from_host(buf.get(), src.data(), count * sizeof(int32_t));
      std::fill(src.begin(), src.end(), -7);
    }
    std::vector<float> reuse(count, 0.3125f);  // the freed heap written again, as gradients are
    AllreduceOptions o;
    o.after_compute = false;
    comm->allreduce(buf.get(), count, DType::i32, o)->wait(30s);
    std::vector<int32_t> got(count);
    comm->copy_to_host(got.data(), buf.get(), count * sizeof(int32_t));
    const int32_t want = 1000 * n * (n - 1) / 2 + n * round;
    ASSERT_EQ(std::count(got.begin(), got.end(), want), static_cast<std::ptrdiff_t>(count)) << "round " << round;
  }
}

// The bf16 wire on the device: the share-rounding and widening kernels around an ncclBfloat16
// sum, and the from_root broadcast of the root's rounded share. Exact for the harness's
// gradients with average world on a power-of-two world (see the MPI engine test); half the bytes.
TEST(Nccl, EngineOnABf16Wire) {
  if (!gpus_available()) GTEST_SKIP() << "fewer GPUs than ranks on this host";
  auto comm = nccl();
  const int world = comm->size();
  for (Average avg : {Average::world, Average::contributors})
    for (int broadcast_min_ranks : {0, 2}) {
      EngineOptions o;
      o.average = avg;
      o.timeout = 60s;
      o.wire = DType::bf16;
      o.broadcast_min_ranks = broadcast_min_ranks;
      Engine engine(comm, model_plan(), o);
      RunResult r = run_engine(engine, device_memory(), 20, 1);
      const bool exact = avg == Average::world && (world & (world - 1)) == 0;
      expect_matches_reference(r, model_plan(), world, 1, o, exact ? 0.0 : world * 0.004);
    }
}

// Send/recv in one group call: a ring in both directions (each rank sends to the next and
// receives from the previous at once), reduce-scatter, and the device time of each operation.
TEST(Nccl, SendRecvRingReduceScatterAndTimes) {
  if (!gpus_available()) GTEST_SKIP() << "fewer GPUs than ranks on this host";
  auto comm = nccl();
  const int r = comm->rank(), n = comm->size();
  const size_t count = 4096;
  auto out = comm->allocate(count * 4), in = comm->allocate(count * 4);
  std::vector<float> h(count);
  for (size_t i = 0; i < count; ++i) h[i] = static_cast<float>(r) * 10000.0f + static_cast<float>(i);
  cudaMemcpy(out.get(), h.data(), count * 4, cudaMemcpyHostToDevice);
  WorkPtr w = comm->exchange({send_op(out.get(), count, DType::f32, (r + 1) % n),
                              recv_op(in.get(), count, DType::f32, (r + n - 1) % n)},
                             {"ring", 1, -1});
  w->wait(30s);
  EXPECT_GE(w->elapsed_ms(), 0.0);
  cudaMemcpy(h.data(), in.get(), count * 4, cudaMemcpyDeviceToHost);
  const int prev = (r + n - 1) % n;
  for (size_t i = 0; i < count; i += 511) ASSERT_EQ(h[i], static_cast<float>(prev) * 10000.0f + static_cast<float>(i)) << i;
  // Every rank's block b holds b + 1: the sum of block r is n (r + 1).
  std::vector<float> blocks(static_cast<size_t>(n) * 8);
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<float>(i / 8 + 1);
  cudaMemcpy(out.get(), blocks.data(), blocks.size() * 4, cudaMemcpyHostToDevice);
  comm->reduce_scatter(out.get(), in.get(), 8, DType::f32, ReduceOp::sum, {"rs", 1, -1})->wait(30s);
  std::vector<float> mine(8);
  cudaMemcpy(mine.data(), in.get(), 32, cudaMemcpyDeviceToHost);
  EXPECT_EQ(mine, std::vector<float>(8, static_cast<float>(n * (r + 1))));
  EXPECT_THROW(comm->send(out.get(), 1, DType::f32, r, {}), thetad::InternalError);
}

// Engine::keep on the device: a kept bucket is not sent, its keeper's gradient is its own, divided
// on the compute stream as NCCL's PreMulSum would (average world), never rounded to bf16.
TEST(Nccl, EngineKeepsASoleContributorsGradient) {
  if (!gpus_available()) GTEST_SKIP() << "fewer GPUs than ranks on this host";
  auto comm = nccl();
  const int world = comm->size(), rank = comm->rank();
  for (DType wire : {DType::f32, DType::bf16}) {
    EngineOptions o = options(true, Average::world);
    o.wire = wire;
    Engine engine(comm, model_plan(), o);
    // Group 4: rank 0 alone, at even steps (the harness's schedule).
    RunResult r = run_engine(engine, device_memory(), 8, 1, {}, [&](int64_t) { engine.keep(4, 0); });
    const BucketPlan& plan = model_plan();
    for (size_t step = 0; step < r.stats.size(); step += 2) {
      EXPECT_GT(r.stats[step].buckets_kept, 0) << step;
      if (rank != 0) continue;
      const Reference ref = reference(plan, world, static_cast<int64_t>(step), 1, Average::world);
      for (size_t p = 0; p < plan.params.size(); ++p) {
        if (plan.params[p].group != 4) continue;
        for (size_t i = 0; i < plan.params[p].numel; ++i) {
          ASSERT_NEAR(r.grads[step][p][i], ref.grads[p][i], 1e-6 * std::max(1.0f, std::abs(ref.grads[p][i])));
        }
      }
    }
  }
}

TEST(Nccl, TimeoutAbortsAndNamesTheBucket) {
  if (!gpus_available()) GTEST_SKIP() << "fewer GPUs than ranks on this host";
  auto comm = nccl();
  comm->set_default_timeout(2s);  // the watchdog's limit
  auto buf = comm->allocate(64);
  comm->barrier({})->wait(30s);
  if (comm->rank() == 0) {
    AllreduceOptions o;
    o.tag = {"allreduce", 17, 3};
    auto w = comm->allreduce(buf.get(), 16, DType::f32, o);
    try {
      w->wait(10s);
      ADD_FAILURE() << "no timeout";
    } catch (const thetad::TimeoutError& e) {
      // #3: after the constructor's warm-up barrier and the barrier above.
      EXPECT_EQ(std::string(e.what()),
                "collective #3 (allreduce of bucket 3 at step 17) did not finish within 2 s");
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  comm->abort("test over");
}
