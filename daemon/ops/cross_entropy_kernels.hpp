// The cross-entropy loss of bf16 logits and its gradient in one kernel, for the output layer on
// GPUs (daemon/ops/fused_cross_entropy.cpp): the logits are read twice and the gradient written
// once in bf16, where LibTorch's operators widen the logits to float32 and pass over them four
// times. Torch-free, compiled with the CUDA toolkit only (THETAD_MODEL_KERNELS).
#pragma once

#include <cstdint>

namespace thetad::daemon::kernels {

// For each row r of logits [rows, classes] (bf16 bits, contiguous), in float32: loss[r] =
// logsumexp(logits[r]) - logits[r][targets[r]], and grad[r] = (softmax(logits[r]) -
// onehot(targets[r])) * scale rounded to bf16. grad may be logits (overwritten in place). Queued
// on `stream` (a cudaStream_t).
void softmax_gradient(const uint16_t* logits, const int64_t* targets, float* loss, uint16_t* grad, int64_t rows,
                      int64_t classes, float scale, void* stream);

}  // namespace thetad::daemon::kernels
