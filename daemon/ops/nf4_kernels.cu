// The nf4 dequantization kernel (see nf4_kernels.hpp). A grid-stride loop: eight values a thread
// from one 4-byte load of codes (a 64-value block holds eight such runs, so all eight share one
// absmax), stored as one 16-byte vector of bf16 where the count and the pointers allow; a byte
// (two values) a thread otherwise.
#include "daemon/ops/nf4_kernels.hpp"

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.hpp"
#include "daemon/ops/bf16_vectors.cuh"

namespace thetad::daemon::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kBlock = 64;  // values per absmax

struct CodeBook {
  float v[16];
};

unsigned blocks_for(int64_t count) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((count + kThreads - 1) / kThreads, 65535)));
}

// The value of code c of a block of largest magnitude m, rounded once to bf16.
__device__ __forceinline__ bf16 value(const float* book, unsigned c, float m) { return __float2bfloat16_rn(book[c] * m); }

template <typename Out>
__device__ __forceinline__ void put(Out* out, int64_t e, bf16 v);
template <>
__device__ __forceinline__ void put<bf16>(bf16* out, int64_t e, bf16 v) {
  out[e] = v;
}
template <>
__device__ __forceinline__ void put<float>(float* out, int64_t e, bf16 v) {
  out[e] = __bfloat162float(v);
}

__global__ void dequantize_vec(const uint32_t* __restrict__ codes, const bf16* __restrict__ absmax, CodeBook book,
                               int64_t runs, bf16* __restrict__ out) {
  __shared__ float b[16];
  if (threadIdx.x < 16) b[threadIdx.x] = book.v[threadIdx.x];
  __syncthreads();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < runs; i += stride) {
    const uint32_t word = codes[i];
    const float m = __bfloat162float(absmax[(i * 8) / kBlock]);
    uint4 u;
    bf16* h = reinterpret_cast<bf16*>(&u);
#pragma unroll
    for (int byte = 0; byte < 4; ++byte) {  // little-endian: byte 0 holds values 0 and 1
      const unsigned c = (word >> (8 * byte)) & 0xffu;
      h[2 * byte] = value(b, c >> 4, m);
      h[2 * byte + 1] = value(b, c & 0xfu, m);
    }
    reinterpret_cast<uint4*>(out)[i] = u;
  }
}

template <typename Out>
__global__ void dequantize_bytes(const uint8_t* __restrict__ codes, const bf16* __restrict__ absmax, CodeBook book,
                                 int64_t numel, Out* __restrict__ out) {
  const int64_t bytes = (numel + 1) / 2, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes; i += stride) {
    const unsigned c = codes[i];
    const int64_t e = 2 * i;
    const float m = __bfloat162float(absmax[e / kBlock]);  // e and e + 1 share a block (blocks are of an even size)
    put(out, e, value(book.v, c >> 4, m));
    if (e + 1 < numel) put(out, e + 1, value(book.v, c & 0xfu, m));
  }
}

}  // namespace

void nf4_dequantize(const uint8_t* codes, const uint16_t* absmax_bits, const float* code_book, int64_t numel,
                    uint16_t* out_bf16, float* out_f32, void* stream) {
  const auto* absmax = reinterpret_cast<const bf16*>(absmax_bits);
  if (numel == 0) return;
  CodeBook book;
  for (int c = 0; c < 16; ++c) book.v[c] = code_book[c];
  auto* s = static_cast<cudaStream_t>(stream);
  if (out_bf16 && numel % 8 == 0 && reinterpret_cast<uintptr_t>(codes) % 4 == 0 && aligned16(out_bf16)) {
    const int64_t runs = numel / 8;
    dequantize_vec<<<blocks_for(runs), kThreads, 0, s>>>(reinterpret_cast<const uint32_t*>(codes), absmax, book, runs,
                                                         reinterpret_cast<bf16*>(out_bf16));
  } else if (out_bf16) {
    dequantize_bytes<bf16><<<blocks_for((numel + 1) / 2), kThreads, 0, s>>>(codes, absmax, book, numel,
                                                                             reinterpret_cast<bf16*>(out_bf16));
  } else {
    dequantize_bytes<float><<<blocks_for((numel + 1) / 2), kThreads, 0, s>>>(codes, absmax, book, numel, out_f32);
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace thetad::daemon::kernels
