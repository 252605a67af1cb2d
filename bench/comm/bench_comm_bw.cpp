// Bandwidth probe of thetad's own Communicator (a benchmark that can fail, nccl-tests style; not a
// test): allreduce, broadcast, reduce-scatter, all-gather and send/recv (a ring: each rank sends
// to the next and receives from the previous in one exchange) at the engine's bucket sizes, over
// MPI on the CPU or NCCL on GPUs. Prints, per operation and size, the median time from a barrier
// to completion (the slowest rank's), algbw and busbw with nccl-tests' formulas
// (comm/bandwidth.hpp), the numbers a GPU run's metrics (allreduce_algbw_gbs, allreduce_busbw_gbs,
// broadcast_algbw_gbs) are set beside.
//
// Sizes: 1 and 25 MiB (the engine's first bucket and bucket cap by default) and the distinct
// bucket sizes comm::make_bucket_plan cuts for a multitask_mlp (--mlp D,TRUNK,HEADS,TASKS; the
// reference job bench/jobs/reference.yaml by default: 4096,8,2,16), or --sizes-mb A,B,...
// Exits 1 when --min-busbw is given and an allreduce of the largest size stays below it.
//
//   mpirun -np 2 build/bench/comm/bench_comm_bw [--backend auto|mpi|nccl] [--sizes-mb 1,25,64]
//       [--mlp 4096,8,2,16] [--ops allreduce,broadcast,reduce_scatter,allgather,sendrecv]
//       [--warmup 2] [--iters 10] [--min-busbw GBPS] [--json out.json]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench_args.hpp"
#include "comm/backends.hpp"
#include "comm/bandwidth.hpp"
#include "comm/bootstrap.hpp"
#include "comm/bucket_plan.hpp"
#include "comm/control_plane.hpp"
#include "comm/mpi_check.hpp"

#if THETAD_WITH_CUDA
#include <cuda_runtime.h>

#include "common/cuda_check.hpp"
#endif

namespace {

using namespace thetad::comm;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string backend = "auto";
  std::vector<double> sizes_mb;
  std::vector<int64_t> mlp = {4096, 8, 2, 16};
  std::vector<std::string> ops = {"allreduce", "broadcast", "reduce_scatter", "allgather", "sendrecv"};
  int warmup = 2;
  int iters = 10;
  double min_busbw = 0;
  std::string json;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "bench_comm_bw: " << why
            << "\nusage: bench_comm_bw [--backend auto|mpi|nccl] [--sizes-mb A,B,...] [--mlp D,TRUNK,HEADS,TASKS]"
               " [--ops allreduce,broadcast,reduce_scatter,allgather,sendrecv] [--warmup N] [--iters N]"
               " [--min-busbw GBPS] [--json PATH]\n";
  std::exit(2);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  thetad::bench::parse_flags(argc, argv, usage, [&](const std::string& k, const std::string& v) {
    if (k == "--backend") a.backend = v;
    else if (k == "--sizes-mb") {
      a.sizes_mb.clear();
      for (const auto& s : split(v)) a.sizes_mb.push_back(std::stod(s));
    } else if (k == "--mlp") {
      a.mlp.clear();
      for (const auto& s : split(v)) a.mlp.push_back(std::stoll(s));
    } else if (k == "--ops") a.ops = split(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else if (k == "--iters") a.iters = std::stoi(v);
    else if (k == "--min-busbw") a.min_busbw = std::stod(v);
    else if (k == "--json") a.json = v;
    else return false;
    return true;
  });
  if (a.backend != "auto" && a.backend != "mpi" && a.backend != "nccl") usage("--backend must be auto, mpi or nccl");
  if (a.mlp.size() != 4 || *std::min_element(a.mlp.begin(), a.mlp.end()) < 1) usage("--mlp needs four positive numbers");
  for (double s : a.sizes_mb)
    if (!(s > 0)) usage("sizes must be positive");
  const std::set<std::string> known = {"allreduce", "broadcast", "reduce_scatter", "allgather", "sendrecv"};
  for (const auto& op : a.ops)
    if (!known.count(op)) usage("unknown operation '" + op + "'");
  if (a.warmup < 0 || a.iters < 1) usage("--warmup must be >= 0 and --iters >= 1");
  return a;
}

// The distinct bucket sizes (bytes) of a multitask_mlp (trunk Linear layers D x D, heads of HEADS
// such layers, weight then bias of each, registered trunk first) cut by the engine's default caps.
std::vector<size_t> mlp_bucket_bytes(const std::vector<int64_t>& m) {
  const auto d = static_cast<size_t>(m[0]);
  const int trunk = static_cast<int>(m[1]), heads = static_cast<int>(m[2]), tasks = static_cast<int>(m[3]);
  std::vector<ParamInfo> params;
  const auto linear = [&](const std::string& name, int group) {
    params.push_back({name + ".weight", d * d, group});
    params.push_back({name + ".bias", d, group});
  };
  for (int i = 0; i < trunk; ++i) linear("trunk." + std::to_string(i), 0);
  for (int t = 0; t < tasks; ++t)
    for (int i = 0; i < heads; ++i) linear("heads." + std::to_string(t) + "." + std::to_string(i), t + 1);
  BucketPlanOptions po;
  po.bucket_cap_bytes = size_t{25} << 20;
  po.first_bucket_bytes = size_t{1} << 20;
  std::set<size_t> sizes;
  for (const Bucket& b : make_bucket_plan(params, tasks + 1, po).buckets) sizes.insert(b.numel * sizeof(float));
  return {sizes.begin(), sizes.end()};
}

struct Row {
  std::string op;
  size_t bytes;
  double ms, algbw, busbw;
};

int run(const Args& a, const WorldInfo& w) {
  ControlPlane plane(make_mpi_communicator());
  std::shared_ptr<Communicator> comm;
  bool gpu = false;
#if THETAD_WITH_CUDA
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess) {
    (void)cudaGetLastError();
    ndev = 0;
  }
  int enough = ndev >= std::max(1, w.local_size) ? 1 : 0, all = 0;
  MPI_CHECK(MPI_Allreduce(&enough, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (a.backend == "nccl" && !all) {
    if (w.rank == 0) std::cout << "bench_comm_bw: SKIP: --backend nccl, but not a GPU per rank" << std::endl;
    return 0;
  }
  gpu = a.backend == "nccl" || (a.backend == "auto" && all);
  if (gpu) {
    CUDA_CHECK(cudaSetDevice(w.local_rank % ndev));
    comm = make_nccl_communicator(w.local_rank % ndev, plane);
  }
#else
  if (a.backend == "nccl") {
    if (w.rank == 0) std::cout << "bench_comm_bw: SKIP: built without CUDA/NCCL" << std::endl;
    return 0;
  }
#endif
  if (!comm) comm = make_mpi_communicator();
  const int n = comm->size(), r = comm->rank();
  std::vector<size_t> sizes;
  if (a.sizes_mb.empty()) {
    sizes = {size_t{1} << 20, size_t{25} << 20};
    for (size_t b : mlp_bucket_bytes(a.mlp)) sizes.push_back(b);
  } else {
    for (double mb : a.sizes_mb) sizes.push_back(static_cast<size_t>(mb * (1 << 20)));
  }
  // Whole blocks of float32 per rank, so that every operation moves the same bytes.
  for (size_t& s : sizes) s = std::max<size_t>(1, s / (4 * n)) * 4 * n;
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  const size_t largest = sizes.back();
  std::shared_ptr<void> in = comm->allocate(largest), out = comm->allocate(largest);
  const auto wait = [&](const WorkPtr& work) { work->wait(comm->default_timeout()); };
  std::vector<Row> rows;
  for (const std::string& op : a.ops) {
    for (size_t bytes : sizes) {
      const size_t count = bytes / 4, block = count / static_cast<size_t>(n);
      const CollectiveTag tag{"probe " + op, -1, -1};
      std::function<void()> once;
      CollectiveKind kind = CollectiveKind::allreduce;
      AllreduceOptions sum;
      sum.tag = tag;
      if (op == "allreduce") {
        once = [&] { wait(comm->allreduce(in.get(), count, DType::f32, sum)); };
      } else if (op == "broadcast") {
        kind = CollectiveKind::broadcast;
        once = [&] { wait(comm->broadcast(in.get(), count, DType::f32, 0, tag)); };
      } else if (op == "reduce_scatter") {
        kind = CollectiveKind::reduce_scatter;
        once = [&] { wait(comm->reduce_scatter(in.get(), out.get(), block, DType::f32, ReduceOp::sum, tag)); };
      } else if (op == "allgather") {
        kind = CollectiveKind::allgather;
        once = [&] { wait(comm->allgather(in.get(), out.get(), block, DType::f32, tag)); };
      } else {
        kind = CollectiveKind::sendrecv;
        if (n < 2) continue;
        once = [&] {
          wait(comm->exchange({send_op(in.get(), count, DType::f32, (r + 1) % n),
                               recv_op(out.get(), count, DType::f32, (r + n - 1) % n)},
                              tag));
        };
      }
      std::vector<double> t;
      for (int i = 0; i < a.warmup + a.iters; ++i) {
        wait(comm->barrier({}));
        MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        const auto t0 = Clock::now();
        once();
        if (i >= a.warmup) t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
      const double ms = thetad::bench::median_of_slowest(t), alg = algbw_gbs(static_cast<double>(bytes), ms);
      rows.push_back({op, bytes, ms, alg, alg * bus_factor(kind, n)});
    }
  }
  bool pass = true;
  for (const Row& row : rows)
    if (a.min_busbw > 0 && row.op == "allreduce" && row.bytes == largest && row.busbw < a.min_busbw) pass = false;
  if (r == 0) {
    std::printf("bench_comm_bw: %d ranks over %s (%s memory), %d iters (+%d warm-up); sizes from %s\n", n,
                comm->backend_name(), gpu ? "device" : "host", a.iters, a.warmup,
                a.sizes_mb.empty() ? "1, 25 MiB and the multitask_mlp's buckets (--mlp)" : "--sizes-mb");
    std::printf("%-15s %12s %10s %12s %12s\n", "operation", "bytes", "time_ms", "algbw_GB/s", "busbw_GB/s");
    for (const Row& row : rows)
      std::printf("%-15s %12zu %10.3f %12.2f %12.2f\n", row.op.c_str(), row.bytes, row.ms, row.algbw, row.busbw);
    if (a.min_busbw > 0)
      std::printf("RESULT allreduce busbw at %zu bytes >= %.2f GB/s: %s\n", largest, a.min_busbw, pass ? "PASS" : "FAIL");
    std::fflush(stdout);
    if (!a.json.empty()) {
      std::ofstream f(a.json);
      f << "{\"ranks\": " << n << ", \"backend\": \"" << comm->backend_name() << "\", \"pass\": " << (pass ? "true" : "false")
        << ", \"rows\": [";
      for (size_t i = 0; i < rows.size(); ++i)
        f << (i ? ", " : "") << "{\"op\": \"" << rows[i].op << "\", \"bytes\": " << rows[i].bytes << ", \"ms\": " << rows[i].ms
          << ", \"algbw_GBps\": " << rows[i].algbw << ", \"busbw_GBps\": " << rows[i].busbw << "}";
      f << "]}\n";
      if (!f) std::cerr << "bench_comm_bw: cannot write " << a.json << "\n";
    }
  }
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  MpiSession mpi(&argc, &argv);
  const WorldInfo w = world_info();
  try {
    return run(a, w);
  } catch (const std::exception& e) {
    std::cerr << "bench_comm_bw: rank " << w.rank << ": error: " << e.what() << std::endl;
    abort_job(1);
  }
}
