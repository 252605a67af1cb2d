// scale_f32_async (see scale.hpp).
#include "comm/nccl/scale.hpp"

#include <algorithm>

#include "common/cuda_check.hpp"

namespace thetad::comm {
namespace {

__global__ void scale_kernel(float* __restrict__ x, size_t n, float f) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) x[i] *= f;
}

}  // namespace

void scale_f32_async(float* data, size_t count, float factor, cudaStream_t stream) {
  if (count == 0) return;
  constexpr int kThreads = 256;
  // Enough blocks to fill a large GPU; the grid-stride loop covers the rest.
  const size_t want = (count + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>(want, 4096));
  scale_kernel<<<blocks, kThreads, 0, stream>>>(data, count, factor);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace thetad::comm
