// The Llama layer's kernels (see llama_kernels.hpp). Grid-stride loops over pairs of elements the
// arithmetic couples (gate j with up j; a head's element i with i + head / 2), bf16 loaded and
// stored, float32 in between: eight pairs a thread in 16-byte loads where the widths and the
// pointers allow (the Llama shapes do), one pair a thread otherwise.
#include "daemon/ops/llama_kernels.hpp"

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.hpp"
#include "daemon/ops/bf16_vectors.cuh"

namespace thetad::daemon::kernels {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t count) {
  return static_cast<unsigned>(std::min<int64_t>((count + kThreads - 1) / kThreads, 65535));
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

__global__ void swiglu_forward_vec(const bf16* __restrict__ gu, bf16* __restrict__ out, int64_t rows, int64_t ff) {
  const int64_t per_row = ff / kVec, n = rows * per_row, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / per_row, j = (i - r * per_row) * kVec;
    float g[kVec], u[kVec], o[kVec];
    load8(gu + r * 2 * ff + j, g);
    load8(gu + r * 2 * ff + ff + j, u);
#pragma unroll
    for (int e = 0; e < kVec; ++e) o[e] = g[e] * sigmoid(g[e]) * u[e];
    store8(out + r * ff + j, o);
  }
}

__global__ void swiglu_backward_vec(const bf16* __restrict__ gu, const bf16* __restrict__ dout, bf16* __restrict__ dgu,
                                    int64_t rows, int64_t ff) {
  const int64_t per_row = ff / kVec, n = rows * per_row, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / per_row, j = (i - r * per_row) * kVec;
    float g[kVec], u[kVec], d[kVec], dg[kVec], du[kVec];
    load8(gu + r * 2 * ff + j, g);
    load8(gu + r * 2 * ff + ff + j, u);
    load8(dout + r * ff + j, d);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float sg = sigmoid(g[e]);
      dg[e] = d[e] * u[e] * sg * (1.0f + g[e] * (1.0f - sg));
      du[e] = d[e] * g[e] * sg;
    }
    store8(dgu + r * 2 * ff + j, dg);
    store8(dgu + r * 2 * ff + ff + j, du);
  }
}

__global__ void swiglu_forward_kernel(const bf16* __restrict__ gu, bf16* __restrict__ out, int64_t rows, int64_t ff) {
  const int64_t n = rows * ff, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / ff, j = i - r * ff;
    const float g = __bfloat162float(gu[r * 2 * ff + j]), u = __bfloat162float(gu[r * 2 * ff + ff + j]);
    out[i] = __float2bfloat16_rn(g * sigmoid(g) * u);
  }
}

__global__ void swiglu_backward_kernel(const bf16* __restrict__ gu, const bf16* __restrict__ dout, bf16* __restrict__ dgu,
                                       int64_t rows, int64_t ff) {
  const int64_t n = rows * ff, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / ff, j = i - r * ff;
    const float g = __bfloat162float(gu[r * 2 * ff + j]), u = __bfloat162float(gu[r * 2 * ff + ff + j]);
    const float d = __bfloat162float(dout[i]), s = sigmoid(g);
    dgu[r * 2 * ff + j] = __float2bfloat16_rn(d * u * s * (1.0f + g * (1.0f - s)));
    dgu[r * 2 * ff + ff + j] = __float2bfloat16_rn(d * g * s);
  }
}

// Where head h (of the joined output's heads: q's, then k's, then v's) of token t starts in the
// split tensors.
__device__ __forceinline__ bf16* split_head(int64_t t, int64_t h, const RotaryShape& s, bf16* q, bf16* k, bf16* v) {
  if (h < s.heads) return q + (t * s.heads + h) * s.head;
  if (h < s.heads + s.kv_heads) return k + (t * s.kv_heads + (h - s.heads)) * s.head;
  return v + (t * s.kv_heads + (h - s.heads - s.kv_heads)) * s.head;
}

// One thread per pair (element i < head / 2 of a head and i + head / 2) of every q, k and v head
// of every token. Forward reads `joined` and writes q, k, v; backward reads the gradients of q,
// k, v from those and writes the joined gradient, rotated back.
template <bool kForward>
__global__ void rotary_split_kernel(bf16* __restrict__ joined, bf16* __restrict__ q, bf16* __restrict__ k,
                                    bf16* __restrict__ v, const float* __restrict__ cos, const float* __restrict__ sin,
                                    RotaryShape s) {
  const int64_t half = s.head / 2, heads_all = s.heads + 2 * s.kv_heads, width = heads_all * s.head;
  const int64_t n = s.tokens * heads_all * half, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < n; p += stride) {
    const int64_t t = p / (heads_all * half), rest = p - t * heads_all * half;
    const int64_t h = rest / half, i = rest - h * half;
    bf16* const split = split_head(t, h, s, q, k, v);
    bf16* const out = kForward ? split : joined + t * width + h * s.head;
    const bf16* const in = kForward ? joined + t * width + h * s.head : split;
    const float x1 = __bfloat162float(in[i]), x2 = __bfloat162float(in[i + half]);
    if (h >= s.heads + s.kv_heads) {  // v: as it is
      out[i] = in[i];
      out[i + half] = in[i + half];
      continue;
    }
    const int64_t pos = (t % s.seq) * s.head;
    const float c1 = cos[pos + i], c2 = cos[pos + i + half], s1 = sin[pos + i], s2 = sin[pos + i + half];
    const float sign = kForward ? 1.0f : -1.0f;
    out[i] = __float2bfloat16_rn(x1 * c1 - sign * x2 * s1);
    out[i + half] = __float2bfloat16_rn(x2 * c2 + sign * x1 * s2);
  }
}

// rotary_split_kernel with a thread per eight pairs (head / 2 a multiple of eight).
template <bool kForward>
__global__ void rotary_split_vec(bf16* __restrict__ joined, bf16* __restrict__ q, bf16* __restrict__ k,
                                 bf16* __restrict__ v, const float* __restrict__ cos, const float* __restrict__ sin,
                                 RotaryShape s) {
  const int64_t half = s.head / 2, chunks = half / kVec, heads_all = s.heads + 2 * s.kv_heads, width = heads_all * s.head;
  const int64_t n = s.tokens * heads_all * chunks, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < n; p += stride) {
    const int64_t t = p / (heads_all * chunks), rest = p - t * heads_all * chunks;
    const int64_t h = rest / chunks, i = (rest - h * chunks) * kVec;
    bf16* const split = split_head(t, h, s, q, k, v);
    bf16* const out = kForward ? split : joined + t * width + h * s.head;
    const bf16* const in = kForward ? joined + t * width + h * s.head : split;
    if (h >= s.heads + s.kv_heads) {  // v: as it is
      *reinterpret_cast<uint4*>(out + i) = *reinterpret_cast<const uint4*>(in + i);
      *reinterpret_cast<uint4*>(out + i + half) = *reinterpret_cast<const uint4*>(in + i + half);
      continue;
    }
    float x1[kVec], x2[kVec], o1[kVec], o2[kVec];
    load8(in + i, x1);
    load8(in + i + half, x2);
    const float* c = cos + (t % s.seq) * s.head + i;
    const float* sn = sin + (t % s.seq) * s.head + i;
    const float sign = kForward ? 1.0f : -1.0f;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      o1[e] = x1[e] * c[e] - sign * x2[e] * sn[e];
      o2[e] = x2[e] * c[e + half] + sign * x1[e] * sn[e + half];
    }
    store8(out + i, o1);
    store8(out + i + half, o2);
  }
}

template <bool kForward>
void launch_rotary(uint16_t* joined, uint16_t* q, uint16_t* k, uint16_t* v, const float* cos, const float* sin,
                   const RotaryShape& s, void* stream) {
  const int64_t pairs = s.tokens * (s.heads + 2 * s.kv_heads) * (s.head / 2);
  if (pairs == 0) return;
  const auto st = static_cast<cudaStream_t>(stream);
  auto* j = reinterpret_cast<bf16*>(joined);
  auto* bq = reinterpret_cast<bf16*>(q);
  auto* bk = reinterpret_cast<bf16*>(k);
  auto* bv = reinterpret_cast<bf16*>(v);
  if ((s.head / 2) % kVec == 0 && aligned16(joined) && aligned16(q) && aligned16(k) && aligned16(v) && aligned16(cos) && aligned16(sin))
    rotary_split_vec<kForward><<<blocks_for(pairs / kVec), kThreads, 0, st>>>(j, bq, bk, bv, cos, sin, s);
  else
    rotary_split_kernel<kForward><<<blocks_for(pairs), kThreads, 0, st>>>(j, bq, bk, bv, cos, sin, s);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void swiglu_forward(const uint16_t* gu, uint16_t* out, int64_t rows, int64_t ff, void* stream) {
  if (rows * ff == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (ff % kVec == 0 && aligned16(gu) && aligned16(out))
    swiglu_forward_vec<<<blocks_for(rows * ff / kVec), kThreads, 0, s>>>(reinterpret_cast<const bf16*>(gu),
                                                                         reinterpret_cast<bf16*>(out), rows, ff);
  else
    swiglu_forward_kernel<<<blocks_for(rows * ff), kThreads, 0, s>>>(reinterpret_cast<const bf16*>(gu),
                                                                     reinterpret_cast<bf16*>(out), rows, ff);
  CUDA_CHECK(cudaGetLastError());
}

void swiglu_backward(const uint16_t* gu, const uint16_t* g, uint16_t* d_gu, int64_t rows, int64_t ff, void* stream) {
  if (rows * ff == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const auto* in = reinterpret_cast<const bf16*>(gu);
  const auto* grad = reinterpret_cast<const bf16*>(g);
  auto* out = reinterpret_cast<bf16*>(d_gu);
  if (ff % kVec == 0 && aligned16(gu) && aligned16(g) && aligned16(d_gu))
    swiglu_backward_vec<<<blocks_for(rows * ff / kVec), kThreads, 0, s>>>(in, grad, out, rows, ff);
  else
    swiglu_backward_kernel<<<blocks_for(rows * ff), kThreads, 0, s>>>(in, grad, out, rows, ff);
  CUDA_CHECK(cudaGetLastError());
}

void rotary_split_forward(const uint16_t* qkv, const float* cos, const float* sin, uint16_t* q, uint16_t* k,
                          uint16_t* v, const RotaryShape& s, void* stream) {
  launch_rotary<true>(const_cast<uint16_t*>(qkv), q, k, v, cos, sin, s, stream);  // qkv only read
}

void rotary_split_backward(const uint16_t* dq, const uint16_t* dk, const uint16_t* dv, const float* cos,
                           const float* sin, uint16_t* d_qkv, const RotaryShape& s, void* stream) {
  // dq, dk, dv only read
  launch_rotary<false>(d_qkv, const_cast<uint16_t*>(dq), const_cast<uint16_t*>(dk), const_cast<uint16_t*>(dv), cos,
                       sin, s, stream);
}

}  // namespace thetad::daemon::kernels
