// Adam and AdamW over many fp32 tensors in one kernel launch on GPUs (daemon/optim/optimizer.cpp):
// a block per chunk of 4,096 elements of any tensor, so that a group of thousands of small
// tensors (a task's adapters) fills the GPU. LibTorch's fused multi-tensor step launches lists of
// at most a few dozen tensors, a few dozen blocks each: at these sizes it ran at a third of the
// memory's speed. Torch-free, compiled with the CUDA toolkit only (THETAD_MODEL_KERNELS).
#pragma once

#include <cstdint>

namespace thetad::daemon::kernels {

// One tensor's operands, contiguous float32 of n elements; first_chunk: the first block of the
// launch that works on it (the chunks of the tensors before it, summed).
struct AdamTensor {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t n, first_chunk;
};

// The step's arithmetic, as torch.optim's: AdamW (decoupled) param *= 1 - lr weight_decay, Adam
// grad += weight_decay param; then the moments, and param -= step_size m / (sqrt(v) /
// bias2_sqrt + eps). grad is multiplied by grad_scale first (clipping), not written.
struct AdamArithmetic {
  float lr, beta1, beta2, eps, weight_decay, grad_scale, step_size, bias2_sqrt;
  bool decoupled;
};

constexpr int64_t kAdamChunk = 4096;

// Steps the `count` tensors whose table `tensors` is in device memory; `chunks` blocks in all.
void adam_step(const AdamTensor* tensors, int count, int64_t chunks, const AdamArithmetic& a, void* stream);

}  // namespace thetad::daemon::kernels
