// The CPU Adam kernel for AVX-512 (16 lanes): cpu_adam_body.hpp with this width's traits. Compiled
// with -mavx512f; called only where the CPU has it (cpu_adam.cpp).
#include <immintrin.h>

#include "offload/cpu_adam_body.hpp"

// GCC 12 flags _mm512_sqrt_ps's internal _mm512_undefined_ps as maybe-uninitialized (a false
// positive of the header, not of this code).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace thetad::offload::detail {
namespace {

struct Avx512 {
  using V = __m512;
  using Mask = __mmask16;
  static constexpr size_t kWidth = 16;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const float* p, Mask k) { return _mm512_maskz_loadu_ps(k, p); }
  static void store(float* p, V x) { _mm512_storeu_ps(p, x); }
  static void store(float* p, V x, Mask k) { _mm512_mask_storeu_ps(p, k, x); }
  static Mask tail(size_t lanes) { return static_cast<Mask>((1u << lanes) - 1u); }  // lanes <= 16
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V sqrt(V a) { return _mm512_sqrt_ps(a); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
};

}  // namespace

void adam_kernel_avx512(float* p, const float* g, float* m, float* v, size_t n, const AdamConsts& c) {
  adam_kernel<Avx512>(p, g, m, v, n, c);
}

}  // namespace thetad::offload::detail
