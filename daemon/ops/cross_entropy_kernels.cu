// The cross-entropy's softmax and gradient over bf16 logits in one kernel (see
// cross_entropy_kernels.hpp). A block per row: the first pass keeps a running maximum and the
// sum of exponentials below it (rescaled when the maximum rises), combined over the block; the
// second pass reads the row again (from the cache) and writes the gradient. Eight values a
// thread per load where the width and the pointers allow, one otherwise.
#include "daemon/ops/cross_entropy_kernels.hpp"

#include <cstdint>

#include "common/cuda_check.hpp"
#include "daemon/ops/bf16_vectors.cuh"

namespace thetad::daemon::kernels {
namespace {

constexpr int kRowThreads = 512;

// (m, s): a maximum and the sum of exp(x - m) over the values seen; the pair for both halves.
__device__ __forceinline__ void combine(float& m, float& s, float m2, float s2) {
  const float top = fmaxf(m, s2 > 0.0f ? m2 : m);
  s = (s > 0.0f ? s * __expf(m - top) : 0.0f) + (s2 > 0.0f ? s2 * __expf(m2 - top) : 0.0f);
  m = top;
}

// The block's log-sum-exp of the values whose pairs the threads hold, in every thread.
__device__ float block_logsumexp(float m, float s) {
  __shared__ float ms[kRowThreads / 32], ss[kRowThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    combine(m, s, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, s, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    ms[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  m = ms[0];
  s = ss[0];
  for (int w = 1; w < kRowThreads / 32; ++w) combine(m, s, ms[w], ss[w]);
  return m + __logf(s);
}

template <int V>
__global__ void softmax_gradient_kernel(const bf16* logits, const int64_t* __restrict__ targets,
                                        float* __restrict__ loss, bf16* grad, int64_t classes, float scale) {
  const int64_t row = blockIdx.x, base = row * classes;
  float m = -INFINITY, s = 0.0f;
  for (int64_t j = static_cast<int64_t>(threadIdx.x) * V; j < classes; j += kRowThreads * V) {
    float x[V];
    if constexpr (V == kVec) load8(logits + base + j, x);
    else x[0] = __bfloat162float(logits[base + j]);
    float top = x[0], sum = 0.0f;
#pragma unroll
    for (int e = 1; e < V; ++e) top = fmaxf(top, x[e]);
#pragma unroll
    for (int e = 0; e < V; ++e) sum += __expf(x[e] - top);
    combine(m, s, top, sum);
  }
  const float lse = block_logsumexp(m, s);
  const int64_t target = targets[row];
  if (threadIdx.x == 0) loss[row] = lse - __bfloat162float(logits[base + target]);
  // grad may be logits itself: each value is read before the same thread writes it.
  for (int64_t j = static_cast<int64_t>(threadIdx.x) * V; j < classes; j += kRowThreads * V) {
    float x[V];
    if constexpr (V == kVec) load8(logits + base + j, x);
    else x[0] = __bfloat162float(logits[base + j]);
#pragma unroll
    for (int e = 0; e < V; ++e) x[e] = (__expf(x[e] - lse) - (j + e == target ? 1.0f : 0.0f)) * scale;
    if constexpr (V == kVec) store8(grad + base + j, x);
    else grad[base + j] = __float2bfloat16_rn(x[0]);
  }
}

}  // namespace

void softmax_gradient(const uint16_t* logits, const int64_t* targets, float* loss, uint16_t* grad, int64_t rows,
                      int64_t classes, float scale, void* stream) {
  if (rows == 0 || classes == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const auto* in = reinterpret_cast<const bf16*>(logits);
  auto* out = reinterpret_cast<bf16*>(grad);
  if (classes % kVec == 0 && aligned16(logits) && aligned16(grad))
    softmax_gradient_kernel<kVec><<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(in, targets, loss, out, classes, scale);
  else
    softmax_gradient_kernel<1><<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(in, targets, loss, out, classes, scale);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace thetad::daemon::kernels
