// The one kernel of the communication library: x *= factor over a float32 device buffer, queued
// on a stream (the root's scaling before a from_root broadcast; see AllreduceOptions).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace thetad::comm {

void scale_f32_async(float* data, size_t count, float factor, cudaStream_t stream);

}  // namespace thetad::comm
