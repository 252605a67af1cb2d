// The communication library's kernels (see scale.hpp).
#include "comm/nccl/scale.hpp"

#include <cuda_bf16.h>

#include <algorithm>

#include "common/cuda_check.hpp"

namespace thetad::comm {
namespace {

__global__ void scale_kernel(float* __restrict__ x, size_t n, float f) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) x[i] *= f;
}

__global__ void to_bf16_kernel(const float* __restrict__ x, __nv_bfloat16* __restrict__ w, size_t n, float f) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    w[i] = __float2bfloat16_rn(x[i] * f);
}

__global__ void from_bf16_kernel(const __nv_bfloat16* __restrict__ w, float* __restrict__ x, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] = __bfloat162float(w[i]);
}

constexpr int kThreads = 256;

// Enough blocks to fill a large GPU; the grid-stride loops cover the rest.
unsigned blocks_for(size_t count) {
  return static_cast<unsigned>(std::min<size_t>((count + kThreads - 1) / kThreads, 4096));
}

}  // namespace

void scale_f32_async(float* data, size_t count, float factor, cudaStream_t stream) {
  if (count == 0) return;
  scale_kernel<<<blocks_for(count), kThreads, 0, stream>>>(data, count, factor);
  CUDA_CHECK(cudaGetLastError());
}

void to_bf16_scaled_async(const float* src, uint16_t* wire, size_t count, float factor, cudaStream_t stream) {
  if (count == 0) return;
  to_bf16_kernel<<<blocks_for(count), kThreads, 0, stream>>>(src, reinterpret_cast<__nv_bfloat16*>(wire), count, factor);
  CUDA_CHECK(cudaGetLastError());
}

void from_bf16_async(const uint16_t* wire, float* dst, size_t count, cudaStream_t stream) {
  if (count == 0) return;
  from_bf16_kernel<<<blocks_for(count), kThreads, 0, stream>>>(reinterpret_cast<const __nv_bfloat16*>(wire), dst, count);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace thetad::comm
