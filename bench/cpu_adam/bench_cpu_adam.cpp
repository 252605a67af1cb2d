// CPU Adam throughput: thetad's adam_step against torch::optim::AdamW::step on the same 64M
// fp32 parameters, and adam_step as a fraction of the memory-bandwidth bound (28 bytes moved per
// parameter: read p, g, m, v; write p, m, v) taken from a memcpy measured in the same run.
//
//   bench_cpu_adam [millions of elements, default 64] [iterations, default 5] [threads, default:
//                  the CPUs of the affinity mask]
//   BENCH_ADAM_SHARED=1 also runs adam_step on a MAP_SHARED mapping, as the host arena's memory is
//   (needs 14 instead of 10 arrays of memory). BENCH_ADAM_GRAD_SCALE=1e-20 gives subnormal moments.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "offload/cpu_adam.hpp"
#include "common/thread_pool.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Best of `iters` runs of fn, in seconds (best, not mean: the floor the machine allows).
template <typename F>
double best_of(int iters, F&& fn) {
  double best = 1e30;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

const char* kUsage =
    "usage: bench_cpu_adam [MILLIONS] [ITERATIONS] [THREADS]\n"
    "  MILLIONS    fp32 parameters in millions (default 64); the run holds about 40 bytes per\n"
    "              parameter, which must fit in the memory available now\n"
    "  ITERATIONS  1..1000 (default 5)\n"
    "  THREADS     1..4096 (default: the CPUs of the affinity mask)\n";

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "bench_cpu_adam: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}

// argv[i] as a number in [lo, hi], or the usage message and exit 2.
double arg_in(const char* text, double lo, double hi, const char* what) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(v >= lo && v <= hi))
    usage(std::string(what) + " '" + text + "' is not a number in [" + std::to_string(lo) + ", " +
          std::to_string(hi) + "]");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 4) usage("too many arguments");
  if (argc > 1 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0)) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const double millions = argc > 1 ? arg_in(argv[1], 1e-6, 1e9, "MILLIONS") : 64.0;
  const size_t n = static_cast<size_t>(millions * double(1u << 20));
  const int iters = argc > 2 ? static_cast<int>(arg_in(argv[2], 1, 1000, "ITERATIONS")) : 5;
  if (argc > 3) thetad::ThreadPool::configure(static_cast<size_t>(arg_in(argv[3], 1, 4096, "THREADS")));
  const size_t bytes = n * sizeof(float);
  // Refuse what cannot fit instead of dying in bad_alloc or the OOM killer: ten arrays of n
  // floats (copy source and destination, p, g, m, v, and torch's copies of them).
  const double need = (std::getenv("BENCH_ADAM_SHARED") ? 14.0 : 10.0) * static_cast<double>(bytes);
  const double avail = double(::sysconf(_SC_AVPHYS_PAGES)) * double(::sysconf(_SC_PAGESIZE));
  if (avail > 0 && need > avail)
    usage(std::to_string(millions) + " million parameters need about " + std::to_string(int64_t(need / 1e9)) +
          " GB; " + std::to_string(int64_t(avail / 1e9)) + " GB are available");

  // Copy bandwidth: memcpy over the pool's threads, as adam_step uses them, counting bytes read
  // plus bytes written (the same accounting as the 28 bytes per parameter).
  std::vector<float> src(n, 1.0f), dst(n, 0.0f);
  auto& pool = thetad::ThreadPool::instance();
  const size_t chunks = pool.threads() * 4;
  const size_t per = (n + chunks - 1) / chunks;
  auto copy = [&] {
    pool.parallel_for(chunks, [&](size_t c) {
      const size_t b = c * per, e = std::min(n, b + per);
      if (b < e) std::memcpy(dst.data() + b, src.data() + b, (e - b) * sizeof(float));
    });
  };
  copy();
  const double t_copy = best_of(iters, copy);
  const double copy_bw = 2.0 * static_cast<double>(bytes) / t_copy;
  // memcpy's destination costs a read for ownership as well, which adam_step's writes do not
  // (it reads every array it writes). An in-place read-modify-write pass has adam_step's
  // access pattern; the bound below takes the faster of the two, the stricter yardstick.
  auto rmw = [&] {
    pool.parallel_for(chunks, [&](size_t c) {
      const size_t b = c * per, e = std::min(n, b + per);
      float* x = dst.data();
      for (size_t i = b; i < e; ++i) x[i] = x[i] * 0.5f + 1.0f;
    });
  };
  rmw();
  const double t_rmw = best_of(iters, rmw);
  const double rmw_bw = 2.0 * static_cast<double>(bytes) / t_rmw;
  const double bw = std::max(copy_bw, rmw_bw);

  // thetad adam_step.
  // BENCH_ADAM_GRAD_SCALE scales the gradients: at 1e-20 their squares (Adam's second moment)
  // are subnormal floats, as in the lowest layers of a deep trunk whose gradients vanish.
  const char* scale_env = std::getenv("BENCH_ADAM_GRAD_SCALE");
  const float grad_scale = scale_env ? static_cast<float>(arg_in(scale_env, 0, 1e30, "BENCH_ADAM_GRAD_SCALE")) : 1.0f;
  std::vector<float> p(n), g(n), m(n, 0.f), v(n, 0.f);
  for (size_t i = 0; i < n; ++i) {
    p[i] = static_cast<float>(i % 1000) * 1e-3f;
    g[i] = (static_cast<float>((i * 7) % 1000) * 1e-3f - 0.5f) * grad_scale;
  }
  thetad::offload::AdamHyper h;
  h.lr = 1e-3;
  h.weight_decay = 0.01;
  h.decoupled = true;
  int64_t step = 0;
  auto ours = [&] {
    h.step = ++step;
    thetad::offload::adam_step(p.data(), g.data(), m.data(), v.data(), n, h);
  };
  ours();
  const double t_ours = best_of(iters, ours);
  // The same with IEEE subnormals kept (adam_step flushes them by default): with
  // BENCH_ADAM_GRAD_SCALE=1e-20 the difference is what flushing saves on this CPU.
  thetad::offload::set_flush_subnormals(false);
  const double t_ieee = best_of(iters, ours);
  thetad::offload::set_flush_subnormals(true);

  // The same on memory mapped as the host arena's (an MPI shared window is a shared mapping:
  // 4 KiB pages unless the kernel's shmem huge pages are on). At tens of GB the page tables of
  // 4 KiB pages no longer fit the caches: this shows what that costs at this size.
  double t_shared = 0;
  if (std::getenv("BENCH_ADAM_SHARED")) {
    void* mem = ::mmap(nullptr, 4 * bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) usage("mmap of the shared mapping failed");
    float* s = static_cast<float*>(mem);
    float* parts[4] = {s, s + n, s + 2 * n, s + 3 * n};
    const float* from[4] = {p.data(), g.data(), m.data(), v.data()};
    pool.parallel_for(chunks, [&](size_t c) {
      const size_t b = c * per, e = std::min(n, b + per);
      for (int k = 0; k < 4; ++k)
        if (b < e) std::memcpy(parts[k] + b, from[k] + b, (e - b) * sizeof(float));
    });
    auto shared = [&] {
      h.step = ++step;
      thetad::offload::adam_step(parts[0], parts[1], parts[2], parts[3], n, h);
    };
    t_shared = best_of(iters, shared);
    ::munmap(mem, 4 * bytes);
  }

  // LibTorch AdamW on the same values.
  // Same threads for torch as for adam_step.
  at::set_num_threads(static_cast<int>(pool.threads()));
  torch::NoGradGuard no_grad;
  auto tp = torch::from_blob(p.data(), {static_cast<int64_t>(n)}, torch::kFloat32).clone();
  tp.set_requires_grad(true);
  tp.mutable_grad() = torch::from_blob(g.data(), {static_cast<int64_t>(n)}, torch::kFloat32).clone();
  torch::optim::AdamW opt({tp}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  opt.step();
  const double t_torch = best_of(iters, [&] { opt.step(); });

  const double ours_pps = static_cast<double>(n) / t_ours;
  const double torch_pps = static_cast<double>(n) / t_torch;
  const double bound_pps = bw / 28.0;
  std::printf("CPU Adam benchmark: %zu parameters (%.0fM), best of %d, %zu threads, kernel %s, "
              "torch threads %d, gradients x %g\n",
              n, static_cast<double>(n) / (1 << 20), iters, pool.threads(),
              thetad::offload::adam_kernel_name().c_str(), at::get_num_threads(), double(grad_scale));
  std::printf("%-28s %12s %14s %14s\n", "", "ms/step", "Mparams/s", "vs torch");
  std::printf("%-28s %12.1f %14.1f %13.2fx\n", "torch::optim::AdamW::step", t_torch * 1e3,
              torch_pps / 1e6, 1.0);
  std::printf("%-28s %12.1f %14.1f %13.2fx\n", "thetad adam_step", t_ours * 1e3, ours_pps / 1e6,
              ours_pps / torch_pps);
  std::printf("%-28s %12.1f %14.1f %13.2fx\n", "adam_step, IEEE subnormals", t_ieee * 1e3,
              static_cast<double>(n) / t_ieee / 1e6, static_cast<double>(n) / t_ieee / torch_pps);
  std::printf("%-28s %12.1f %14.1f %14s\n", "bandwidth bound (28 B/param)", n / bound_pps * 1e3,
              bound_pps / 1e6, "");
  std::printf("bandwidth (bytes read + written): memcpy %.2f GB/s, in-place read-modify-write "
              "%.2f GB/s; adam_step moves %.2f GB/s = %.0f%% of the bound\n",
              copy_bw / 1e9, rmw_bw / 1e9, ours_pps * 28.0 / 1e9, 100.0 * ours_pps / bound_pps);
  if (t_shared > 0) {
    std::string thp, shmem;
    std::getline(std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled"), thp);
    std::getline(std::ifstream("/sys/kernel/mm/transparent_hugepage/shmem_enabled"), shmem);
    std::printf("adam_step on a shared mapping (as the host arena): %.1f ms = %.2f GB/s (THP: %s; shmem: %s)\n",
                t_shared * 1e3, 28.0 * static_cast<double>(n) / t_shared / 1e9, thp.c_str(), shmem.c_str());
  }
  return 0;
}
