// Move-only owners of the CUDA handles offload/ creates: a non-blocking stream and an event
// without timing, each on a given device. Destruction selects that device first: the last owner
// may go on another thread (the store's optimizer worker), and a CUDA call on a thread without
// a current device would create a context on GPU 0. Only with THETAD_WITH_CUDA.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common/cuda_check.hpp"

namespace thetad::offload {

// One owner for both kinds: Kind says how a handle is made and destroyed.
template <typename Kind>
class CudaHandle {
 public:
  using Handle = typename Kind::Handle;
  explicit CudaHandle(int device) : device_(device) {
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(Kind::create(&h_));
  }
  ~CudaHandle() { reset(); }
  CudaHandle(CudaHandle&& o) noexcept : device_(o.device_), h_(std::exchange(o.h_, nullptr)) {}
  CudaHandle& operator=(CudaHandle&& o) noexcept {
    if (this != &o) {
      reset();
      device_ = o.device_;
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  CudaHandle(const CudaHandle&) = delete;
  CudaHandle& operator=(const CudaHandle&) = delete;
  Handle get() const { return h_; }

 private:
  void reset() noexcept {
    if (!h_) return;
    cudaSetDevice(device_);
    Kind::destroy(h_);
    h_ = nullptr;
  }
  int device_;
  Handle h_ = nullptr;
};

struct StreamKind {
  using Handle = cudaStream_t;
  static cudaError_t create(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamNonBlocking); }
  static void destroy(cudaStream_t s) noexcept { cudaStreamDestroy(s); }
};

struct EventKind {
  using Handle = cudaEvent_t;
  static cudaError_t create(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDisableTiming); }
  // Destroying a pending event is allowed: CUDA releases it once it completes.
  static void destroy(cudaEvent_t e) noexcept { cudaEventDestroy(e); }
};

// A non-blocking stream and an event without timing, each on a given device.
using CudaStream = CudaHandle<StreamKind>;
using CudaEvent = CudaHandle<EventKind>;

}  // namespace thetad::offload
