// CPU Adam/AdamW: the choice of kernel (scalar here; AVX2+FMA and AVX-512 in their own units, all
// one width-generic body: cpu_adam_body.hpp), its multi-threaded driver, the bf16 copy of the
// parameters, and the gradient's sum of squares. Compiled with -ffp-contract=off.
#include "offload/cpu_adam.hpp"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include "comm/bf16.hpp"
#include "offload/cpu_adam_body.hpp"
#include "common/thread_pool.hpp"

namespace thetad::offload {
namespace {

using detail::AdamConsts;

AdamConsts make_consts(const AdamHyper& h) {
  AdamConsts c{};
  const double step = static_cast<double>(h.step < 1 ? 1 : h.step);
  const double bc1 = 1.0 - std::pow(h.beta1, step);
  const double bc2 = 1.0 - std::pow(h.beta2, step);
  c.gscale = static_cast<float>(h.grad_scale);
  c.decay = h.decoupled ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f;
  c.use_l2 = !h.decoupled && h.weight_decay != 0.0;
  c.l2 = static_cast<float>(h.weight_decay);
  c.b1 = static_cast<float>(h.beta1);
  c.omb1 = static_cast<float>(1.0 - h.beta1);
  c.b2 = static_cast<float>(h.beta2);
  c.omb2 = static_cast<float>(1.0 - h.beta2);
  c.sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  c.eps = static_cast<float>(h.eps);
  c.neg_step = static_cast<float>(-h.lr / bc1);
  return c;
}

// The body's traits for one lane: any CPU (std::fma is exact where the CPU has no FMA).
struct Scalar {
  using V = float;
  using Mask = int;
  static constexpr size_t kWidth = 1;
  static V load(const float* p) { return *p; }
  static V load(const float* p, Mask) { return *p; }
  static void store(float* p, V x) { *p = x; }
  static void store(float* p, V x, Mask) { *p = x; }
  static Mask tail(size_t) { return 0; }
  static V set1(float x) { return x; }
  static V mul(V a, V b) { return a * b; }
  static V add(V a, V b) { return a + b; }
  static V div(V a, V b) { return a / b; }
  static V sqrt(V a) { return std::sqrt(a); }
  static V fma(V a, V b, V c) { return std::fma(a, b, c); }
};

#define THETAD_AVX512 __attribute__((target("avx512f")))

// GCC 12 flags the AVX-512 headers' _mm512_undefined_* as maybe-uninitialized (a false positive
// of the header, not of this code).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

void bf16_scalar(const float* p, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = comm::float_to_bf16(p[i]);
}

// comm::float_to_bf16 on 16 lanes: bits + 0x7fff + lsb, the upper half; a NaN keeps its upper
// half with the quiet bit set. Where `out` is 32-byte aligned (the arena's copies are) the
// stores are non-temporal: an ordinary store first reads each line it writes, which made the
// bf16 copy cost 4 bytes of host traffic per parameter instead of 2 (CPU AdamW 8.24 -> 9.54 ms
// over 128 MiB on the H100 host); the sfence orders them before the caller publishes the group.
THETAD_AVX512 void bf16_avx512(const float* p, uint16_t* out, size_t n) {
  size_t i = 0;
  const bool stream = (reinterpret_cast<uintptr_t>(out) & 31) == 0;
  const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i quiet = _mm512_set1_epi32(0x40);
  for (; i + 16 <= n; i += 16) {
    const __m512i b = _mm512_loadu_si512(p + i);
    const __m512i hi = _mm512_srli_epi32(b, 16);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(half, _mm512_and_si512(hi, one))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, abs_mask), inf);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, quiet));
    auto* dst = reinterpret_cast<__m256i*>(out + i);
    if (stream) _mm256_stream_si256(dst, _mm512_cvtepi32_epi16(r));
    else _mm256_storeu_si256(dst, _mm512_cvtepi32_epi16(r));
  }
  if (stream) _mm_sfence();
  bf16_scalar(p + i, out + i, n - i);
}
#pragma GCC diagnostic pop

using Bf16Kernel = void (*)(const float*, uint16_t*, size_t);

using Kernel = void (*)(float*, const float*, float*, float*, size_t, const AdamConsts&);

std::atomic<int> g_forced{0};

int detect() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return 3;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
  return 1;
}

int best_available() {
  static const int best = detect();
  return best;
}

int selected() {
  const int forced = g_forced.load(std::memory_order_relaxed);
  const int best = best_available();
  return (forced > 0 && forced <= best) ? forced : best;
}

Kernel kernel_for(int which) {
  switch (which) {
    case 3: return detail::adam_kernel_avx512;
    case 2: return detail::adam_kernel_avx2;
    default: return detail::adam_kernel_scalar;
  }
}

Bf16Kernel bf16_kernel_for(int which) { return which == 3 ? bf16_avx512 : bf16_scalar; }

// Below this many elements per chunk the hand-off costs more than it saves.
constexpr size_t kMinChunk = 64 * 1024;

std::atomic<bool> g_flush_subnormals{true};

// Runs the kernel with the MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6) set on
// this thread, and puts the caller's MXCSR back after. Why: the lowest layers of a deep trunk
// have vanishing gradients whose squares are subnormal floats, and Intel cores take a microcode
// assist on every FMA that reads or makes one: on one H100 host the streamed trunk's CPU Adam ran
// at 50-100 GB/s instead of 135+ while its trunk still learned, and at full speed once its
// gradients grew. What flushing changes is below accuracy: sqrt(v) < 1.1e-19 vanishes next to
// eps, and a subnormal m moves a parameter by under 1e-30, which leaves every parameter above
// ~1e-23 in magnitude bitwise as it was. torch.set_flush_denormal(True) does the same for
// PyTorch's CPU kernels.
// With p_bf16, the rounded copy of each block of p is written right after the block's update,
// while the block is in L1 (a block is 8 KiB of p).
constexpr size_t kBf16Block = 2048;

void run_blocks(Kernel k, float* p, const float* g, float* m, float* v, size_t n, const AdamConsts& c,
                uint16_t* p_bf16) {
  if (!p_bf16) {
    k(p, g, m, v, n, c);
    return;
  }
  const Bf16Kernel round = bf16_kernel_for(selected());
  for (size_t b = 0; b < n; b += kBf16Block) {
    const size_t len = std::min(kBf16Block, n - b);
    k(p + b, g + b, m + b, v + b, len, c);
    round(p + b, p_bf16 + b, len);
  }
}

void run_kernel(Kernel k, float* p, const float* g, float* m, float* v, size_t n, const AdamConsts& c,
                uint16_t* p_bf16) {
  if (!g_flush_subnormals.load(std::memory_order_relaxed)) {
    run_blocks(k, p, g, m, v, n, c, p_bf16);
    return;
  }
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);
  run_blocks(k, p, g, m, v, n, c, p_bf16);
  _mm_setcsr(saved);
}

}  // namespace

void detail::adam_kernel_scalar(float* p, const float* g, float* m, float* v, size_t n, const AdamConsts& c) {
  detail::adam_kernel<Scalar>(p, g, m, v, n, c);
}

void adam_step(float* p, const float* g, float* m, float* v, size_t n, const AdamHyper& h, uint16_t* p_bf16) {
  if (n == 0) return;
  const AdamConsts c = make_consts(h);
  const Kernel k = kernel_for(selected());
  ThreadPool& pool = ThreadPool::instance();
  if (n < 2 * kMinChunk || pool.threads() == 1) {
    run_kernel(k, p, g, m, v, n, c, p_bf16);
    return;
  }
  // A few chunks per thread balance uneven progress; chunk starts stay 64-byte aligned
  // relative to the arrays so vector loads of neighbouring chunks never share a cache line.
  size_t chunk = std::max(kMinChunk, n / (pool.threads() * 4));
  chunk = (chunk + 15) & ~size_t{15};
  const size_t chunks = (n + chunk - 1) / chunk;
  pool.parallel_for(chunks, [&](size_t ci) {
    const size_t b = ci * chunk;
    const size_t e = std::min(n, b + chunk);
    run_kernel(k, p + b, g + b, m + b, v + b, e - b, c, p_bf16 ? p_bf16 + b : nullptr);
  });
}

void round_to_bf16(const float* src, uint16_t* dst, size_t n) {
  const Bf16Kernel round = bf16_kernel_for(selected());
  constexpr size_t kChunk = 1 << 20;
  const size_t chunks = (n + kChunk - 1) / kChunk;
  if (chunks <= 1) {
    round(src, dst, n);
    return;
  }
  ThreadPool::instance().parallel_for(chunks, [&](size_t ci) {
    const size_t b = ci * kChunk;
    round(src + b, dst + b, std::min(n, b + kChunk) - b);
  });
}

double sum_squares(const float* g, size_t n) {
  const size_t chunk = 1 << 16;
  const size_t chunks = (n + chunk - 1) / chunk;
  std::vector<double> part(chunks, 0.0);
  ThreadPool::instance().parallel_for(chunks, [&](size_t ci) {
    const size_t b = ci * chunk, e = std::min(n, b + chunk);
    double s = 0.0;
    for (size_t i = b; i < e; ++i) s += static_cast<double>(g[i]) * static_cast<double>(g[i]);
    part[ci] = s;
  });
  double total = 0.0;
  for (double s : part) total += s;
  return total;
}

void set_flush_subnormals(bool on) { g_flush_subnormals.store(on, std::memory_order_relaxed); }

std::string adam_kernel_name() {
  switch (selected()) {
    case 3: return "avx512";
    case 2: return "avx2";
    default: return "scalar";
  }
}

namespace detail {
void force_adam_kernel(int which) { g_forced.store(which, std::memory_order_relaxed); }
}  // namespace detail

}  // namespace thetad::offload
