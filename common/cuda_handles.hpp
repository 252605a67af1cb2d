// The one move-only owner of CUDA handles (streams, events) for every torch-free library
// (comm/nccl, offload). Each handle remembers its device and destruction selects it first: the
// last owner may go on another thread (the store's optimizer worker, the NCCL watchdog), and a
// CUDA call on a thread without a current device would create a context on GPU 0. Only with
// THETAD_WITH_CUDA.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common/cuda_check.hpp"

namespace thetad {

// Owner of a handle `H` released with `Destroy` (its result is ignored: a destructor has no
// one to tell). Empty when default-constructed or moved from.
template <typename H, cudaError_t (*Destroy)(H)>
class CudaHandle {
 public:
  CudaHandle() = default;
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
  H get() const { return h_; }
  explicit operator bool() const { return h_ != nullptr; }

 protected:
  void reset() noexcept {
    if (!h_) return;
    cudaSetDevice(device_);
    Destroy(h_);
    h_ = nullptr;
  }
  int device_ = 0;
  H h_ = nullptr;
};

// A non-blocking stream (no implicit sync with the legacy default stream) on `device` at
// `priority` (0: the default; numerically lower is higher priority).
class CudaStream : public CudaHandle<cudaStream_t, &cudaStreamDestroy> {
 public:
  CudaStream() = default;
  explicit CudaStream(int device, int priority = 0) {
    device_ = device;
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaStreamCreateWithPriority(&h_, cudaStreamNonBlocking, priority));
  }
};

// An event on `device`, without timing unless `timing` (cudaEventElapsedTime between two such).
// Destroying a pending event is allowed: CUDA releases it once it completes.
class CudaEvent : public CudaHandle<cudaEvent_t, &cudaEventDestroy> {
 public:
  CudaEvent() = default;  // empty: for a member created on first use
  explicit CudaEvent(int device, bool timing = false) {
    device_ = device;
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaEventCreateWithFlags(&h_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
};

}  // namespace thetad
