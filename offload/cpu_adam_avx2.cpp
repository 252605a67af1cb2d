// The CPU Adam kernel for AVX2 + FMA (8 lanes): cpu_adam_body.hpp with this width's traits. Compiled
// with -mavx2 -mfma; called only where the CPU has both (cpu_adam.cpp).
#include <immintrin.h>

#include "offload/cpu_adam_body.hpp"

namespace thetad::offload::detail {
namespace {

struct Avx2 {
  using V = __m256;
  using Mask = __m256i;
  static constexpr size_t kWidth = 8;
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const float* p, Mask k) { return _mm256_maskload_ps(p, k); }
  static void store(float* p, V x) { _mm256_storeu_ps(p, x); }
  static void store(float* p, V x, Mask k) { _mm256_maskstore_ps(p, k, x); }
  static Mask tail(size_t lanes) {  // lanes 0 .. lanes-1
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lanes)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V sqrt(V a) { return _mm256_sqrt_ps(a); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
};

}  // namespace

void adam_kernel_avx2(float* p, const float* g, float* m, float* v, size_t n, const AdamConsts& c) {
  adam_kernel<Avx2>(p, g, m, v, n, c);
}

}  // namespace thetad::offload::detail
