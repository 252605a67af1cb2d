// CUDA_CHECK: "CUDA error in file:line: <cudaGetErrorString> (call)" thrown as InternalError (a
// CUDA failure is a bug or a broken device, not a peer problem). For the translation units
// built with THETAD_WITH_CUDA; include <cuda_runtime.h> before it or let it include it.
#pragma once

#include <cuda_runtime.h>

#include "common/errors.hpp"

#define CUDA_CHECK(call)                                                                        \
  do {                                                                                          \
    const cudaError_t thetad_cuda_rc_ = (call);                                                 \
    if (thetad_cuda_rc_ != cudaSuccess)                                                         \
      throw ::thetad::InternalError(::thetad::detail::concat(                                   \
          "CUDA error in ", __FILE__, ":", __LINE__, ": ", cudaGetErrorString(thetad_cuda_rc_), \
          " (", #call, ")"));                                                                   \
  } while (0)
