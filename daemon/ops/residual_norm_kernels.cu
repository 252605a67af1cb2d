// The residual stream's add, RMSNorm and cast to bf16 as one kernel each way (see
// llama_kernels.hpp). A block per row: the first pass adds and sums the squares (forward) or
// the weighted gradient's dot product with the row (backward), a block-wide sum, then the second
// pass reads the row back (from the cache: this block just wrote or read it) and writes the
// outputs. Four values a thread per load where the width and the pointers allow, one otherwise.
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "common/cuda_check.hpp"
#include "daemon/ops/bf16_vectors.cuh"
#include "daemon/ops/llama_kernels.hpp"

namespace thetad::daemon::kernels {
namespace {

constexpr int kRowThreads = 256;

// The sum of v over the block, in every thread (kRowThreads threads, warps of 32).
__device__ float block_sum(float v) {
  __shared__ float warp_sums[kRowThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kRowThreads / 32; ++w) total += warp_sums[w];
  __syncthreads();  // warp_sums is read by all before any block_sum of a later pass writes it
  return total;
}

template <int V>
__global__ void forward_kernel(const float* __restrict__ h, const bf16* __restrict__ o, const float* __restrict__ w,
                               float* __restrict__ sum, bf16* __restrict__ n, float* __restrict__ rstd, int64_t d,
                               float eps) {
  const int64_t row = blockIdx.x;
  const float* in = h + row * d;
  const bf16* add = o ? o + row * d : nullptr;
  float* out = sum ? sum + row * d : nullptr;
  float squares = 0.0f;
  for (int64_t j = static_cast<int64_t>(threadIdx.x) * V; j < d; j += kRowThreads * V) {
    float x[V], a[V];
    load<V>(in + j, x);
    if (add) {
      load<V>(add + j, a);
#pragma unroll
      for (int e = 0; e < V; ++e) x[e] += a[e];
      store<V>(out + j, x);
    }
#pragma unroll
    for (int e = 0; e < V; ++e) squares += x[e] * x[e];
  }
  const float r = rsqrtf(block_sum(squares) / static_cast<float>(d) + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  const float* x_row = out ? out : in;
  for (int64_t j = static_cast<int64_t>(threadIdx.x) * V; j < d; j += kRowThreads * V) {
    float x[V], g[V], y[V];
    load<V>(x_row + j, x);
    load<V>(w + j, g);
#pragma unroll
    for (int e = 0; e < V; ++e) y[e] = g[e] * (x[e] * r);
    store<V>(n + row * d + j, y);
  }
}

template <int V>
__global__ void backward_kernel(const bf16* __restrict__ g_n, const float* __restrict__ x, const float* __restrict__ w,
                                const float* __restrict__ rstd, const float* __restrict__ g_sum, float* __restrict__ g_h,
                                bf16* __restrict__ g_o, int64_t d) {
  const int64_t row = blockIdx.x, base = row * d;
  float dot = 0.0f;
  for (int64_t j = static_cast<int64_t>(threadIdx.x) * V; j < d; j += kRowThreads * V) {
    float g[V], xs[V], ws[V];
    load<V>(g_n + base + j, g);
    load<V>(x + base + j, xs);
    load<V>(w + j, ws);
#pragma unroll
    for (int e = 0; e < V; ++e) dot += ws[e] * g[e] * xs[e];
  }
  const float r = rstd[row];
  const float c = r * r * r * block_sum(dot) / static_cast<float>(d);
  for (int64_t j = static_cast<int64_t>(threadIdx.x) * V; j < d; j += kRowThreads * V) {
    float g[V], xs[V], ws[V], later[V], out[V];
    load<V>(g_n + base + j, g);
    load<V>(x + base + j, xs);
    load<V>(w + j, ws);
    if (g_sum) load<V>(g_sum + base + j, later);
#pragma unroll
    for (int e = 0; e < V; ++e) out[e] = r * ws[e] * g[e] - xs[e] * c + (g_sum ? later[e] : 0.0f);
    if (g_h) store<V>(g_h + base + j, out);
    if (g_o) store<V>(g_o + base + j, out);
  }
}

bool four_wide(int64_t d, std::initializer_list<const void*> pointers) {
  if (d % 4 != 0) return false;
  return std::all_of(pointers.begin(), pointers.end(), [](const void* p) { return p == nullptr || aligned16(p); });
}

}  // namespace

void residual_rms_norm_forward(const float* h, const uint16_t* o, const float* w, float* sum, uint16_t* n, float* rstd,
                               int64_t rows, int64_t d, float eps, void* stream) {
  if (rows * d == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const auto* add = reinterpret_cast<const bf16*>(o);
  auto* out = reinterpret_cast<bf16*>(n);
  if (four_wide(d, {h, o, w, sum, n}))
    forward_kernel<4><<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(h, add, w, sum, out, rstd, d, eps);
  else
    forward_kernel<1><<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(h, add, w, sum, out, rstd, d, eps);
  CUDA_CHECK(cudaGetLastError());
}

void residual_rms_norm_backward(const uint16_t* g_n, const float* x, const float* w, const float* rstd,
                                const float* g_sum, float* g_h, uint16_t* g_o, int64_t rows, int64_t d, void* stream) {
  if (rows * d == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const auto* g = reinterpret_cast<const bf16*>(g_n);
  auto* go = reinterpret_cast<bf16*>(g_o);
  if (four_wide(d, {g_n, x, w, g_sum, g_h, g_o}))
    backward_kernel<4><<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(g, x, w, rstd, g_sum, g_h, go, d);
  else
    backward_kernel<1><<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(g, x, w, rstd, g_sum, g_h, go, d);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace thetad::daemon::kernels
