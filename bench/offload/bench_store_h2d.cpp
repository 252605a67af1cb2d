// Host->device bandwidth of the parameter store against a plain pinned copy (a
// benchmark that can fail, nccl-tests style, not a test).
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
// --floor-steps N (N > 0) then measures the host's floor of an offloaded training step: the
// store's whole per-step work with no model compute. Each rank's store holds --floor-groups
// groups of --group-mb MiB (4 slots, prefetch 1); at step s rank r needs group (s*W + r) mod G + 1
// (data.schedule round_robin, one task per rank). Every step: acquire (H2D, prefetched), the
// owner's D2H of each active group's gradient into the landing area, step_group for every
// active group (the owner's CPU AdamW, asynchronous), release_step. The floor is the wall time
// of N steps after the warm-up, the drain of the queued CPU steps included (slowest rank), and
// the host memory traffic it implies (36 B per active parameter: 28 of AdamW, 4 D2H, 4 H2D).
// An offloaded training step cannot be faster than this floor on the same host. --bf16-copies
// measures it as a bf16 job runs it (offload.h2d_dtype bf16): the AdamW also writes the bf16
// copy (2 B) and the H2D copy moves 2 B, so host traffic stays 36 B while PCIe's H2D halves.
//
//   mpirun -np 2 build/bench/offload/bench_store_h2d [--groups 8] [--group-mb 128]
//       [--warmup 4] [--iters 20] [--min-ratio 0.9] [--floor-steps 0] [--floor-groups 16]
//       [--bf16-copies] [--json out.json]
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
#include "common/log.hpp"
#include "offload/device.hpp"
#include "offload/param_store.hpp"
#include "common/thread_pool.hpp"

#if THETAD_WITH_CUDA
#include "common/cuda_check.hpp"
#include "common/cuda_handles.hpp"
#endif

namespace {

struct Args {
  int groups = 8;
  double group_mb = 128;
  int warmup = 4;
  int iters = 20;
  double min_ratio = 0.9;
  int floor_steps = 0;
  int floor_groups = 16;
  bool bf16_copies = false;
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
    else if (k == "--floor-steps") a.floor_steps = std::stoi(next());
    else if (k == "--floor-groups") a.floor_groups = std::stoi(next());
    else if (k == "--bf16-copies") a.bf16_copies = true;
    else if (k == "--json") a.json = next();
    else throw thetad::ConfigError("bench_store_h2d: unknown option " + k);
  }
  if (a.groups < 3 || a.group_mb <= 0 || a.iters < 1 || a.warmup < 0)
    throw thetad::ConfigError("bench_store_h2d: needs --groups >= 3, --group-mb > 0, --iters >= 1");
  if (a.floor_steps < 0 || a.floor_groups < 1)
    throw thetad::ConfigError("bench_store_h2d: needs --floor-steps >= 0, --floor-groups >= 1");
  return a;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Floor {
  double step_ms = 0;      // wall time per step, slowest rank
  double adam_ms = 0;      // this rank's CPU AdamW time per step (owner steps)
  double host_gbs = 0;     // implied host memory traffic
};

// The store's per-step work of an offloaded round_robin run, without model compute (see the
// header comment).
Floor measure_floor(const Args& a, const thetad::comm::WorldInfo& world, thetad::offload::Device& device,
                    size_t numel) {
  using Clock = std::chrono::steady_clock;
  const int G = a.floor_groups, W = world.size;
  auto group_of = [G, W](int64_t s, int r) { return static_cast<int>((s * W + r) % G) + 1; };
  std::vector<thetad::offload::GroupShape> shapes;
  for (int g = 1; g <= G; ++g) shapes.push_back({g, numel, 1});
  thetad::offload::StoreOptions so;
  so.device_slots = 4;
  so.prefetch = 1;
  so.bf16_copies = a.bf16_copies;
  const int rank = world.rank;
  thetad::offload::ParamStore store(so, shapes, device, [group_of, rank](int64_t s) {
    return std::vector<int>{group_of(s, rank)};
  });
  thetad::ThreadPool::configure(store.cpu_threads());  // as the daemon does
  store.init_all([numel](int, float* dst) { std::fill(dst, dst + numel, 0.5f); });
  // This rank's "reduced gradient" in device memory, pushed for every group it owns.
  auto* grad = static_cast<float*>(device.alloc(numel * sizeof(float)));
  {
    const std::vector<float> init(numel, 0.01f);
    device.host_wait(device.h2d(grad, init.data(), numel * sizeof(float), {}));
  }
  thetad::offload::AdamHyper h;
  h.weight_decay = 0.01;
  std::vector<int64_t> steps(static_cast<size_t>(G) + 1, 0);
  auto run = [&](int64_t from, int64_t to) {
    for (int64_t s = from; s < to; ++s) {
      store.acquire(store.plan().units_of(group_of(s, rank)).at(0), s);
      store.prefetch_for(s);
      for (int r = 0; r < W; ++r) {  // the globally active groups, the same order everywhere
        const int g = group_of(s, r);
        bool seen = false;
        for (int q = 0; q < r; ++q) seen = seen || group_of(s, q) == g;
        if (seen) continue;
        if (store.owns(g)) store.push_grad(store.plan().units_of(g).at(0), grad);
        h.step = ++steps[static_cast<size_t>(g)];
        store.step_group(g, h);
      }
      store.release_step(s);
    }
    store.wait_idle();
    device.host_wait(device.record_compute());
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  };
  run(0, a.warmup);
  const double adam0 = store.stats().cpu_adam_ms;
  const auto t0 = Clock::now();
  run(a.warmup, a.warmup + a.floor_steps);
  double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / a.floor_steps;
  Floor f;
  MPI_CHECK(MPI_Allreduce(&ms, &f.step_ms, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  f.adam_ms = (store.stats().cpu_adam_ms - adam0) / a.floor_steps;
  // Each active group stepped exactly once per host per step (single-host runs), or the
  // floor timed the wrong work.
  unsigned long long mine = store.stats().optimizer_steps, all = 0;
  MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD));
  const auto want = static_cast<unsigned long long>(a.warmup + a.floor_steps) * static_cast<unsigned long long>(std::min(W, G));
  THETAD_CHECK(world.local_size != world.size || all == want, thetad::InternalError,
               "bench_store_h2d: ", all, " CPU optimizer steps ran, expected ", want);
  const double active = static_cast<double>(std::min(W, G)) * static_cast<double>(numel);
  f.host_gbs = active * 36.0 / (f.step_ms * 1e6);
  device.free(grad);
  return f;
}

void print_floor(const Args& a, const thetad::comm::WorldInfo& world, const std::string& where, const Floor& f) {
  std::printf("RESULT host floor of an offloaded step (%d ranks, %s, %.1f MiB groups, %s copies, no compute): %.2f "
              "ms per step, CPU AdamW %.2f ms per step on rank 0, %.1f GB/s of host memory traffic at 36 B/param\n",
              world.size, where.c_str(), a.group_mb, a.bf16_copies ? "bf16" : "fp32", f.step_ms, f.adam_ms, f.host_gbs);
}

}  // namespace

int main(int argc, char** argv) {
  thetad::comm::MpiSession mpi(&argc, &argv);
  int rc = 0;
  try {
    const Args a = parse(argc, argv);
    const auto world = thetad::comm::world_info();
    thetad::log::init({world.rank, "info", ""});  // the store's lines, tagged with their rank
    if (!thetad::offload::cuda_available()) {  // no GPU, or built without CUDA
      if (a.floor_steps > 0) {  // the floor on the host device (copies are memcpy)
        const size_t n = static_cast<size_t>(a.group_mb * (1 << 20)) / sizeof(float);
        thetad::offload::HostDevice host;
        const Floor f = measure_floor(a, world, host, n);
        if (world.rank == 0) print_floor(a, world, "host device", f);
      }
      if (world.rank == 0) std::printf("bench_store_h2d: SKIP (H2D): no GPU visible or built without CUDA\n");
      return 0;
    }
#if THETAD_WITH_CUDA
    int ngpu = 0;
    CUDA_CHECK(cudaGetDeviceCount(&ngpu));
    const int dev = world.local_rank % ngpu;
    CUDA_CHECK(cudaSetDevice(dev));
    const thetad::CudaStream compute_stream(dev);
    const cudaStream_t compute = compute_stream.get();
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
    std::vector<double> store_ms;
    {  // the arena goes before the floor's store is built
      thetad::offload::ParamStore store(so, shapes, *device, [G](int64_t s) {
        return std::vector<int>{static_cast<int>(s % G) + 1};
      });
      thetad::ThreadPool::configure(store.cpu_threads());
      store.init_all([numel](int, float* dst) { std::fill(dst, dst + numel, 0.5f); });
      for (int s = 0; s < a.warmup + a.iters; ++s) {
        const int unit = store.plan().units_of(s % G + 1).at(0);
        const auto t0 = Clock::now();
        store.acquire(unit, s);
        CUDA_CHECK(cudaStreamSynchronize(compute));
        const double t = ms_since(t0);
        store.release_step(s);
        if (s >= a.warmup) store_ms.push_back(t);
      }
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

    Floor floor;
    if (a.floor_steps > 0) floor = measure_floor(a, world, *device, numel);

    const double store_gbs = static_cast<double>(bytes) / (median(store_ms) * 1e6);
    const double raw_gbs = static_cast<double>(bytes) / (median(raw_ms) * 1e6);
    double ratio = store_gbs / raw_gbs, worst = ratio;
    MPI_CHECK(MPI_Allreduce(&ratio, &worst, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD));
    std::printf("rank %d (cuda:%d): store acquire %.2f MB in %.3f ms = %.1f GB/s; pinned cudaMemcpyAsync %.3f ms = "
                "%.1f GB/s; ratio %.3f\n",
                world.rank, dev, bytes / 1e6, median(store_ms), store_gbs, median(raw_ms), raw_gbs, ratio);
    std::fflush(stdout);
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    if (world.rank == 0) {
      std::printf("RESULT store/pinned H2D ratio (slowest rank) %.3f, gate >= %.2f: %s\n", worst, a.min_ratio,
                  worst >= a.min_ratio ? "PASS" : "FAIL");
      if (a.floor_steps > 0) print_floor(a, world, "cuda", floor);
      if (!a.json.empty()) {
        std::ofstream out(a.json);
        out << "{\"store_gbs\": " << store_gbs << ", \"pinned_gbs\": " << raw_gbs << ", \"ratio_min\": " << worst
            << ", \"bytes\": " << bytes << ", \"ranks\": " << world.size << ", \"gate\": " << a.min_ratio;
        if (a.floor_steps > 0)
          out << ", \"floor_step_ms\": " << floor.step_ms << ", \"floor_adam_ms\": " << floor.adam_ms
              << ", \"floor_host_gbs\": " << floor.host_gbs << ", \"floor_group_mb\": " << a.group_mb;
        out << "}\n";
      }
    }
    rc = worst >= a.min_ratio ? 0 : 1;
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_store_h2d: %s\n", e.what());
    return thetad::exit_code_for(e);
  }
  return rc;
}
