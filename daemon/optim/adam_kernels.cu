// adam_step (see adam_kernels.hpp): a block finds its tensor by a binary search over the table's
// first chunks, then steps its chunk, one element a thread per iteration (coalesced float32).
#include "daemon/optim/adam_kernels.hpp"

#include <cuda_runtime.h>

#include "common/cuda_check.hpp"

namespace thetad::daemon::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void adam_kernel(const AdamTensor* __restrict__ tensors, int count, AdamArithmetic a) {
  const int64_t chunk = blockIdx.x;
  int lo = 0, hi = count - 1;  // the last tensor whose first chunk is <= this one
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tensors[mid].first_chunk <= chunk) lo = mid;
    else hi = mid - 1;
  }
  const AdamTensor t = tensors[lo];
  const int64_t begin = (chunk - t.first_chunk) * kAdamChunk;
  const int64_t end = min(begin + kAdamChunk, t.n);
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    float p = t.param[i], g = t.grad[i] * a.grad_scale;
    if (a.decoupled) p -= a.lr * a.weight_decay * p;
    else g += a.weight_decay * p;
    const float m = a.beta1 * t.exp_avg[i] + (1.0f - a.beta1) * g;
    const float v = a.beta2 * t.exp_avg_sq[i] + (1.0f - a.beta2) * g * g;
    t.exp_avg[i] = m;
    t.exp_avg_sq[i] = v;
    t.param[i] = p - a.step_size * m / (sqrtf(v) / a.bias2_sqrt + a.eps);
  }
}

}  // namespace

void adam_step(const AdamTensor* tensors, int count, int64_t chunks, const AdamArithmetic& a, void* stream) {
  if (count == 0 || chunks == 0) return;
  adam_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(tensors, count, a);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace thetad::daemon::kernels
