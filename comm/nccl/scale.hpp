// The kernels of the communication library, queued on a stream: x *= factor over a float32 device
// buffer (the root's scaling before a from_root broadcast), and the bfloat16 wire's conversions
// (AllreduceOptions::wire), which round as comm/bf16.hpp does on the host.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace thetad::comm {

void scale_f32_async(float* data, size_t count, float factor, cudaStream_t stream);
// wire[i] = bf16(src[i] * factor), round to nearest even.
void to_bf16_scaled_async(const float* src, uint16_t* wire, size_t count, float factor, cudaStream_t stream);
// dst[i] = float(wire[i]).
void from_bf16_async(const uint16_t* wire, float* dst, size_t count, cudaStream_t stream);

}  // namespace thetad::comm
