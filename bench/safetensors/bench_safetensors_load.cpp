// How fast a safetensors base becomes fp32 (model.init_from): writes a BF16 checkpoint
// of SIZE_MB in tensors of 16 MiB (or reads PATH), warms the page cache with `cat > /dev/null`
// (timed: the yardstick), then converts every tensor to float32 with THREADS threads, as
// load_safetensors_weights does over parameters. Prints both rates in GB/s of file bytes.
//
//   bench_safetensors_load [--size-mb 1024] [--threads N] [--path FILE] [--keep]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "daemon/formats/safetensors.hpp"

using namespace thetad::daemon;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  size_t size_mb = 1024;
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::string path = "/tmp/thetad_bench_base.safetensors";
  bool write = true, keep = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--size-mb" && i + 1 < argc) size_mb = std::stoul(argv[++i]);
    else if (a == "--threads" && i + 1 < argc) threads = static_cast<unsigned>(std::stoul(argv[++i]));
    else if (a == "--path" && i + 1 < argc) path = argv[++i], write = false;
    else if (a == "--keep") keep = true;
  }
  if (write) {
    const size_t per = 16u << 20, n = size_mb * (1u << 20) / per;
    std::vector<uint16_t> bits(per / 2);
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = st_fp32_to_bf16(static_cast<float>(i % 1000) * 1e-3f);
    std::vector<StWriteTensor> ts;
    for (size_t k = 0; k < n; ++k)
      ts.push_back({"model.layers." + std::to_string(k) + ".mlp.up_proj.weight", "BF16",
                    {static_cast<int64_t>(per / 2 / 4096), 4096}, bits.data(), per});
    write_safetensors(path, ts);
  }
  auto t0 = Clock::now();
  if (std::system(("cat '" + path + "' > /dev/null").c_str()) != 0) return 1;
  const double cat_s = std::chrono::duration<double>(Clock::now() - t0).count();

  t0 = Clock::now();
  const SafetensorsCheckpoint ck = SafetensorsCheckpoint::open(path);
  const std::vector<std::string> names = ck.names();
  size_t bytes = 0;
  for (const auto& n : names) bytes += ck.tensor(n).end - ck.tensor(n).begin;
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < threads; ++w)
    pool.emplace_back([&, w] {
      std::vector<float> dst;
      for (size_t i = w; i < names.size(); i += threads) {
        const StTensor& t = ck.tensor(names[i]);
        dst.resize((t.end - t.begin) / 2);
        ck.read_fp32(names[i], t.shape, dst.data());
      }
    });
  for (auto& t : pool) t.join();
  const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("%.2f GB: cat %.2f GB/s, safetensors to fp32 (%u threads) %.2f GB/s\n", bytes / 1e9, bytes / 1e9 / cat_s,
              threads, bytes / 1e9 / load_s);
  if (write && !keep) std::remove(path.c_str());
  return 0;
}
