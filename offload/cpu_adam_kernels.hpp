// Internal to offload/: CPU Adam's per-step constants and its kernels, one per instruction set
// (cpu_adam.cpp picks one at run time from the CPU's features). Each kernel instantiates the one
// width-generic body (cpu_adam_body.hpp) in a translation unit compiled for its instruction set.
#pragma once

#include <cstddef>

namespace thetad::offload::detail {

// Per-step constants, computed once per call in double like LibTorch, then rounded to float.
struct AdamConsts {
  float gscale, decay, l2, b1, omb1, b2, omb2, sqrt_bc2, eps, neg_step;
  bool use_l2;
};

// One fused pass over n elements; every kernel gives the same bits (cpu_adam_body.hpp).
void adam_kernel_scalar(float* p, const float* g, float* m, float* v, size_t n, const AdamConsts& c);
void adam_kernel_avx2(float* p, const float* g, float* m, float* v, size_t n, const AdamConsts& c);    // -mavx2 -mfma
void adam_kernel_avx512(float* p, const float* g, float* m, float* v, size_t n, const AdamConsts& c);  // -mavx512f

}  // namespace thetad::offload::detail
