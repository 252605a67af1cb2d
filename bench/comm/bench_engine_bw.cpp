// Engine bandwidth benchmark (a benchmark that can fail, nccl-tests style; not a test).
//
// Under mpirun, one rank per GPU: a model's worth of gradient buckets (default 512 MiB of
// 1 MiB parameters cut into 25 MiB buckets by comm::make_bucket_plan) reduced by comm::Engine over
// comm::make_nccl_communicator(local_rank), one full step protocol per iteration
// (declare_active(all) / begin_sync / mark_ready of every parameter in backward order /
// finish_backward), against raw ncclAllReduce of the same total bytes on a plain NCCL
// communicator over the same GPUs: in one call, and in calls of exactly the engine's bucket
// sizes. Also thetad's Communicator::allreduce of the total in one call (the layer under the
// engine). Reports time, algbw = bytes / time and busbw = algbw * 2(n-1)/n for each, and the
// ratios engine / raw. Exits 1 when the gated ratio is below --min-ratio (default 0.9):
//   --gate chunked (default): engine vs raw calls of the same bucket sizes: what the engine
//                             itself costs over NCCL;
//   --gate single:            engine vs one raw call of all bytes: also charges the bucket size;
//   --gate none.
// Times are per iteration, host wall clock from a barrier to completion (the slowest rank),
// median over --iters after --warmup. Zeroing the buckets (start_window) is left out of the
// "engine" line and included in "engine+zero". Without a GPU (or built without CUDA) it prints
// SKIP and exits 0.
//
//   mpirun -np 2 build/bench/comm/bench_engine_bw [--total-mb 512] [--bucket-mb 25]
//       [--first-bucket-mb 25] [--param-mb 1] [--groups 1] [--warmup 5] [--iters 20]
//       [--min-ratio 0.9] [--gate chunked|single|none] [--json out.json]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_args.hpp"
#include "comm/bootstrap.hpp"
#include "comm/bucket_plan.hpp"
#include "comm/control_plane.hpp"
#include "comm/engine.hpp"

#if THETAD_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include "comm/nccl/handles.hpp"
#endif

namespace {

struct Args {
  double total_mb = 512;
  double bucket_mb = 25;
  double first_bucket_mb = 25;
  double param_mb = 1;
  int groups = 1;
  int warmup = 5;
  int iters = 20;
  double min_ratio = 0.9;
  std::string gate = "chunked";
  std::string json;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "bench_engine_bw: " << why
            << "\nusage: bench_engine_bw [--total-mb M] [--bucket-mb M] [--first-bucket-mb M] [--param-mb M]"
               " [--groups G] [--warmup N] [--iters N] [--min-ratio R] [--gate chunked|single|none] [--json PATH]\n";
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  thetad::bench::parse_flags(argc, argv, usage, [&](const std::string& k, const std::string& v) {
    if (k == "--total-mb") a.total_mb = std::stod(v);
    else if (k == "--bucket-mb") a.bucket_mb = std::stod(v);
    else if (k == "--first-bucket-mb") a.first_bucket_mb = std::stod(v);
    else if (k == "--param-mb") a.param_mb = std::stod(v);
    else if (k == "--groups") a.groups = std::stoi(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else if (k == "--iters") a.iters = std::stoi(v);
    else if (k == "--min-ratio") a.min_ratio = std::stod(v);
    else if (k == "--gate") a.gate = v;
    else if (k == "--json") a.json = v;
    else return false;
    return true;
  });
  if (a.total_mb <= 0 || a.bucket_mb <= 0 || a.first_bucket_mb <= 0 || a.param_mb <= 0 || a.groups < 1 ||
      a.warmup < 0 || a.iters < 1)
    usage("sizes, --groups and --iters must be positive");
  if (a.gate != "chunked" && a.gate != "single" && a.gate != "none") usage("--gate must be chunked, single or none");
  return a;
}

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) { o += ' '; continue; }
    o += c;
  }
  return o + "\"";
}

void write_file(const std::string& path, const std::string& text) {
  if (path.empty()) return;
  std::ofstream f(path);
  f << text;
  if (!f) std::cerr << "bench_engine_bw: cannot write " << path << "\n";
}

// Rank 0 prints and writes the skip record; every rank returns 0.
int skip(int rank, const Args& a, const std::string& why) {
  if (rank == 0) {
    std::cout << "bench_engine_bw: SKIP: " << why << std::endl;
    write_file(a.json, "{\"status\": \"skip\", \"reason\": " + json_str(why) + "}\n");
  }
  return 0;
}

struct Result {
  std::string name;
  double ms = 0;  // median over iterations of the slowest rank's time
  double algbw = 0, busbw = 0;  // GB/s (1e9 bytes)
};

#if THETAD_WITH_CUDA

using Clock = std::chrono::steady_clock;

// Runs prep() (untimed), then times op() from a barrier to its completion; median over iters of
// the slowest rank.
double time_median_ms(const Args& a, const std::function<void(int)>& prep, const std::function<void(int)>& op) {
  std::vector<double> t;
  for (int i = 0; i < a.warmup + a.iters; ++i) {
    prep(i);
    CUDA_CHECK(cudaDeviceSynchronize());
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    const auto t0 = Clock::now();
    op(i);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (i >= a.warmup) t.push_back(ms);
  }
  return thetad::bench::median_of_slowest(t);
}

int run_gpu(const Args& a, const thetad::comm::WorldInfo& w) {
  using namespace thetad::comm;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess) {
    cudaGetLastError();
    ndev = 0;
  }
  int need = std::max(1, w.local_size);
  int bad = ndev < need ? 1 : 0, any_bad = 0;
  MPI_CHECK(MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  if (any_bad) {
    std::ostringstream os;
    os << (ndev == 0 ? "no CUDA device visible" : "fewer GPUs than ranks on a host") << " (rank " << w.rank
       << " sees " << ndev << " device(s), " << w.local_size << " rank(s) on its host)";
    return skip(w.rank, a, os.str());
  }
  const int device = w.local_rank % ndev;
  CUDA_CHECK(cudaSetDevice(device));
  ControlPlane plane(make_mpi_communicator());  // the unique id's exchange
  std::shared_ptr<Communicator> comm = make_nccl_communicator(device, plane);

  // The model: equal parameters of --param-mb, spread over --groups groups, all active.
  const size_t param_numel = std::max<size_t>(1, static_cast<size_t>(a.param_mb * (1 << 20) / 4));
  const size_t nparams = std::max<size_t>(1, static_cast<size_t>(std::llround(a.total_mb / a.param_mb)));
  std::vector<ParamInfo> infos;
  for (size_t i = 0; i < nparams; ++i)
    infos.push_back({"p" + std::to_string(i), param_numel, static_cast<int>(i * a.groups / nparams)});
  BucketPlanOptions po;
  po.bucket_cap_bytes = static_cast<size_t>(a.bucket_mb * (1 << 20));
  po.first_bucket_bytes = static_cast<size_t>(a.first_bucket_mb * (1 << 20));
  BucketPlan plan = make_bucket_plan(infos, a.groups, po);
  size_t total_numel = 0;
  std::vector<size_t> bucket_numel;
  for (const Bucket& b : plan.buckets) {
    bucket_numel.push_back(b.numel);
    total_numel += b.numel;
  }
  const double bytes = static_cast<double>(total_numel) * 4.0;
  const int nb = static_cast<int>(plan.buckets.size());
  EngineOptions eo;
  eo.prune = true;
  eo.average = Average::contributors;
  eo.declared = true;
  Engine engine(comm, std::move(plan), eo);
  const std::vector<uint8_t> all_groups(static_cast<size_t>(a.groups), 1);

  // A plain NCCL communicator over the same GPUs for the raw calls.
  ncclUniqueId id;
  if (w.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
  ncclComm_t raw = nullptr;
  NCCL_CHECK(ncclCommInitRank(&raw, w.size, id, w.rank));
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  float* rawbuf = nullptr;
  CUDA_CHECK(cudaMalloc(&rawbuf, total_numel * sizeof(float)));
  CUDA_CHECK(cudaMemset(rawbuf, 0, total_numel * sizeof(float)));
  std::shared_ptr<void> commbuf = comm->allocate(total_numel * sizeof(float));

  auto nothing = [](int) {};
  auto engine_step = [&](int) {
    engine.declare_active(all_groups);
    engine.begin_sync();
    for (int p = static_cast<int>(infos.size()) - 1; p >= 0; --p) (void)engine.mark_ready(p);  // backward order
    (void)engine.finish_backward();
  };
  std::vector<Result> res;
  auto add = [&](const std::string& name, double ms) {
    Result r;
    r.name = name;
    r.ms = ms;
    r.algbw = bytes / (ms * 1e-3) / 1e9;
    r.busbw = r.algbw * 2.0 * (w.size - 1) / w.size;
    res.push_back(r);
  };
  int64_t launched = 0;
  add("engine", time_median_ms(a, [&](int i) { engine.start_window(i); }, engine_step));
  launched = engine.stats().buckets_launched;
  add("engine+zero", time_median_ms(a, nothing, [&](int i) {
        engine.start_window(i);
        engine_step(i);
      }));
  add("raw_single", time_median_ms(a, nothing, [&](int) {
        NCCL_CHECK(ncclAllReduce(rawbuf, rawbuf, total_numel, ncclFloat, ncclSum, raw, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
      }));
  add("raw_chunked", time_median_ms(a, nothing, [&](int) {
        size_t off = 0;
        for (size_t n : bucket_numel) {
          NCCL_CHECK(ncclAllReduce(rawbuf + off, rawbuf + off, n, ncclFloat, ncclSum, raw, stream));
          off += n;
        }
        CUDA_CHECK(cudaStreamSynchronize(stream));
      }));
  add("comm_single", time_median_ms(a, nothing, [&](int) {
        AllreduceOptions o;
        o.tag = {"bench allreduce", -1, -1};
        comm->allreduce(commbuf.get(), total_numel, DType::f32, o)->wait(comm->default_timeout());
      }));

  cudaFree(rawbuf);
  cudaStreamDestroy(stream);
  ncclCommDestroy(raw);

  const double ratio_single = res[0].algbw / res[2].algbw;
  const double ratio_chunked = res[0].algbw / res[3].algbw;
  const double gated = a.gate == "single" ? ratio_single : ratio_chunked;
  const bool pass = a.gate == "none" || gated >= a.min_ratio;
  if (w.rank == 0) {
    char line[256];
    std::printf("bench_engine_bw: %d ranks, %.1f MiB in %d buckets (cap %.1f MiB, first %.1f MiB), %zu params, "
                "%d groups, %d iters (+%d warm-up), launched %lld buckets/step\n",
                w.size, bytes / (1 << 20), nb, a.bucket_mb, a.first_bucket_mb, infos.size(), a.groups, a.iters,
                a.warmup, static_cast<long long>(launched));
    std::printf("%-12s %10s %12s %12s\n", "method", "time_ms", "algbw_GB/s", "busbw_GB/s");
    for (const auto& r : res) std::printf("%-12s %10.3f %12.1f %12.1f\n", r.name.c_str(), r.ms, r.algbw, r.busbw);
    std::snprintf(line, sizeof line,
                  "RESULT engine/raw_single=%.3f engine/raw_chunked=%.3f gate=%s min=%.2f -> %s", ratio_single,
                  ratio_chunked, a.gate.c_str(), a.min_ratio, pass ? "PASS" : "FAIL");
    std::printf("%s\n", line);
    std::fflush(stdout);
    std::ostringstream js;
    js << "{\"status\": \"" << (pass ? "pass" : "fail") << "\", \"ranks\": " << w.size << ", \"bytes\": " << bytes
       << ", \"buckets\": " << nb << ", \"bucket_mb\": " << a.bucket_mb << ", \"first_bucket_mb\": " << a.first_bucket_mb
       << ", \"params\": " << infos.size() << ", \"groups\": " << a.groups << ", \"iters\": " << a.iters
       << ", \"gate\": \"" << a.gate << "\", \"min_ratio\": " << a.min_ratio << ", \"ratio_single\": " << ratio_single
       << ", \"ratio_chunked\": " << ratio_chunked << ", \"ratio_gated\": " << gated << ", \"methods\": {";
    for (size_t i = 0; i < res.size(); ++i)
      js << (i ? ", " : "") << "\"" << res[i].name << "\": {\"ms\": " << res[i].ms << ", \"algbw_GBps\": " << res[i].algbw
         << ", \"busbw_GBps\": " << res[i].busbw << "}";
    js << "}}\n";
    write_file(a.json, js.str());
  }
  return pass ? 0 : 1;
}
#endif  // THETAD_WITH_CUDA

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  thetad::comm::MpiSession mpi(&argc, &argv);
  const thetad::comm::WorldInfo w = thetad::comm::world_info();
#if THETAD_WITH_CUDA
  try {
    return run_gpu(a, w);
  } catch (const std::exception& e) {
    std::cerr << "bench_engine_bw: rank " << w.rank << ": error: " << e.what() << std::endl;
    if (w.rank == 0) write_file(a.json, "{\"status\": \"error\", \"error\": " + json_str(e.what()) + "}\n");
    thetad::comm::abort_job(1);
  }
#else
  return skip(w.rank, a, "built without CUDA/NCCL (THETAD_WITH_CUDA off)");
#endif
}
