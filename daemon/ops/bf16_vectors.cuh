// bf16 values moved as vectors by the model's kernels (llama_kernels.cu, residual_norm_kernels.cu):
// 16-byte loads and stores of eight bf16 values, 8- and 16-byte ones of four bf16 or float32
// values, widened to (and rounded from) float32. The callers check the alignment.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace thetad::daemon::kernels {

using bf16 = __nv_bfloat16;

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

constexpr int kVec = 8;
__device__ __forceinline__ void load8(const bf16* p, float* out) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const bf16* h = reinterpret_cast<const bf16*>(&u);
#pragma unroll
  for (int e = 0; e < kVec; ++e) out[e] = __bfloat162float(h[e]);
}
__device__ __forceinline__ void store8(bf16* p, const float* in) {
  uint4 u;
  bf16* h = reinterpret_cast<bf16*>(&u);
#pragma unroll
  for (int e = 0; e < kVec; ++e) h[e] = __float2bfloat16_rn(in[e]);
  *reinterpret_cast<uint4*>(p) = u;
}

// V values (1 or 4) at p, as float32.
template <int V>
__device__ __forceinline__ void load(const float* p, float* out) {
  if constexpr (V == 4) {
    const float4 u = *reinterpret_cast<const float4*>(p);
    out[0] = u.x, out[1] = u.y, out[2] = u.z, out[3] = u.w;
  } else {
    out[0] = *p;
  }
}
template <int V>
__device__ __forceinline__ void load(const bf16* p, float* out) {
  if constexpr (V == 4) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const bf16* h = reinterpret_cast<const bf16*>(&u);
#pragma unroll
    for (int e = 0; e < 4; ++e) out[e] = __bfloat162float(h[e]);
  } else {
    out[0] = __bfloat162float(*p);
  }
}
template <int V>
__device__ __forceinline__ void store(float* p, const float* in) {
  if constexpr (V == 4) *reinterpret_cast<float4*>(p) = make_float4(in[0], in[1], in[2], in[3]);
  else *p = in[0];
}
template <int V>
__device__ __forceinline__ void store(bf16* p, const float* in) {
  if constexpr (V == 4) {
    uint2 u;
    bf16* h = reinterpret_cast<bf16*>(&u);
#pragma unroll
    for (int e = 0; e < 4; ++e) h[e] = __float2bfloat16_rn(in[e]);
    *reinterpret_cast<uint2*>(p) = u;
  } else {
    *p = __float2bfloat16_rn(in[0]);
  }
}

}  // namespace thetad::daemon::kernels
