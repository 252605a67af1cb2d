// Host->device bandwidth of the parameter store against a plain pinned copy (issue 4's
// benchmark; a benchmark that can fail, nccl-tests style, not a test).
//
// One process per GPU under mpirun (or alone). Each rank builds an offload::ParamStore over a
// CudaDevice with --groups groups of --group-mb MiB and 2 device slots, so that every acquire()
// of the cycling schedule misses and copies its group from the shared pinned host arena; the
// time of one acquire is host wall clock from the call to the compute stream having passed the
// copy (cudaStreamSynchronize), median over --iters after --warmup. The peer, in the same run:
// cudaMemcpyAsync of the same bytes from a cudaHostAlloc buffer into device memory, timed the
// same way. Prints both bandwidths and their ratio; exits 1 when the ratio of the slowest rank
// is below --min-ratio (default 0.9). Without a GPU, or built without CUDA, prints SKIP, exits 0.
//
//   mpirun -np 2 build/bench/offload/bench_store_h2d [--groups 8] [--group-mb 128]
//       [--warmup 4] [--iters 20] [--min-ratio 0.9] [--json out.json]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "comm/bootstrap.hpp"
#include "common/errors.hpp"
#include "offload/device.hpp"
#include "offload/param_store.hpp"

#if THETAD_WITH_CUDA
#include "common/cuda_check.hpp"
#endif

namespace {

struct Args {
  int groups = 8;
  double group_mb = 128;
  int warmup = 4;
  int iters = 20;
  double min_ratio = 0.9;
  std::string json;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw thetad::ConfigError("bench_store_h2d: " + k + " needs a value");
      return argv[++i];
    };
    if (k == "--groups") a.groups = std::stoi(next());
    else if (k == "--group-mb") a.group_mb = std::stod(next());
    else if (k == "--warmup") a.warmup = std::stoi(next());
    else if (k == "--iters") a.iters = std::stoi(next());
    else if (k == "--min-ratio") a.min_ratio = std::stod(next());
    else if (k == "--json") a.json = next();
    else throw thetad::ConfigError("bench_store_h2d: unknown option " + k);
  }
  if (a.groups < 3 || a.group_mb <= 0 || a.iters < 1 || a.warmup < 0)
    throw thetad::ConfigError("bench_store_h2d: needs --groups >= 3, --group-mb > 0, --iters >= 1");
  return a;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  thetad::comm::MpiSession mpi(&argc, &argv);
  int rc = 0;
  try {
    const Args a = parse(argc, argv);
    const auto world = thetad::comm::world_info();
#if THETAD_WITH_CUDA
    if (!thetad::offload::cuda_available()) {
      if (world.rank == 0) std::printf("bench_store_h2d: SKIP: no GPU visible\n");
      return 0;
    }
    int ngpu = 0;
    CUDA_CHECK(cudaGetDeviceCount(&ngpu));
    const int dev = world.local_rank % ngpu;
    CUDA_CHECK(cudaSetDevice(dev));
    cudaStream_t compute = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    const size_t numel = static_cast<size_t>(a.group_mb * (1 << 20)) / sizeof(float);
    const size_t bytes = numel * sizeof(float);
    using Clock = std::chrono::steady_clock;
    auto ms_since = [](Clock::time_point t0) {
      return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    };

    // The store: groups 1..G, 2 slots, no prefetch, step s needs group s % G + 1 (always a miss).
    auto device = thetad::offload::make_cuda_device(dev, compute);
    std::vector<thetad::offload::GroupShape> shapes;
    for (int g = 1; g <= a.groups; ++g) shapes.push_back({g, numel, 1});
    thetad::offload::StoreOptions so;
    so.device_slots = 2;
    so.prefetch = 0;
    const int G = a.groups;
    thetad::offload::ParamStore store(so, shapes, *device, [G](int64_t s) {
      return std::vector<int>{static_cast<int>(s % G) + 1};
    });
    store.init_all([numel](int, float* dst) { std::fill(dst, dst + numel, 0.5f); });
    std::vector<double> store_ms;
    for (int s = 0; s < a.warmup + a.iters; ++s) {
      const int unit = store.units_of(s % G + 1).at(0);
      const auto t0 = Clock::now();
      store.acquire(unit, s);
      CUDA_CHECK(cudaStreamSynchronize(compute));
      const double t = ms_since(t0);
      store.release_step(s);
      if (s >= a.warmup) store_ms.push_back(t);
    }

    // The peer: a plain pinned buffer copied the same way.
    void* host = nullptr;
    void* dst = nullptr;
    CUDA_CHECK(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
    CUDA_CHECK(cudaMalloc(&dst, bytes));
    std::vector<double> raw_ms;
    for (int s = 0; s < a.warmup + a.iters; ++s) {
      const auto t0 = Clock::now();
      CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, compute));
      CUDA_CHECK(cudaStreamSynchronize(compute));
      if (s >= a.warmup) raw_ms.push_back(ms_since(t0));
    }
    CUDA_CHECK(cudaFreeHost(host));
    CUDA_CHECK(cudaFree(dst));

    const double store_gbs = static_cast<double>(bytes) / (median(store_ms) * 1e6);
    const double raw_gbs = static_cast<double>(bytes) / (median(raw_ms) * 1e6);
    double ratio = store_gbs / raw_gbs, worst = ratio;
    MPI_Allreduce(&ratio, &worst, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    std::printf("rank %d (cuda:%d): store acquire %.2f MB in %.3f ms = %.1f GB/s; pinned cudaMemcpyAsync %.3f ms = "
                "%.1f GB/s; ratio %.3f\n",
                world.rank, dev, bytes / 1e6, median(store_ms), store_gbs, median(raw_ms), raw_gbs, ratio);
    std::fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    if (world.rank == 0) {
      std::printf("RESULT store/pinned H2D ratio (slowest rank) %.3f, gate >= %.2f: %s\n", worst, a.min_ratio,
                  worst >= a.min_ratio ? "PASS" : "FAIL");
      if (!a.json.empty()) {
        std::ofstream out(a.json);
        out << "{\"store_gbs\": " << store_gbs << ", \"pinned_gbs\": " << raw_gbs << ", \"ratio_min\": " << worst
            << ", \"bytes\": " << bytes << ", \"ranks\": " << world.size << ", \"gate\": " << a.min_ratio << "}\n";
      }
    }
    rc = worst >= a.min_ratio ? 0 : 1;
#else
    (void)a;
    if (world.rank == 0) std::printf("bench_store_h2d: SKIP: built without CUDA\n");
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_store_h2d: %s\n", e.what());
    return thetad::exit_code_for(e);
  }
  return rc;
}
