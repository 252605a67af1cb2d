// Check macros and move-only RAII owners for the CUDA and NCCL handles of the NCCL backend.
// Compiled only with THETAD_WITH_CUDA.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <utility>

#include "common/cuda_check.hpp"
#include "common/errors.hpp"

// "NCCL error in file:line: <ncclGetErrorString> (<ncclGetLastError>) (call)" as CommError.
#define NCCL_CHECK(call)                                                                      \
  do {                                                                                        \
    const ncclResult_t thetad_nccl_rc_ = (call);                                              \
    if (thetad_nccl_rc_ != ncclSuccess)                                                       \
      throw ::thetad::CommError(::thetad::detail::concat(                                     \
          "NCCL error in ", __FILE__, ":", __LINE__, ": ", ncclGetErrorString(thetad_nccl_rc_), \
          " (", ncclGetLastError(nullptr), ") (", #call, ")"));                               \
  } while (0)

namespace thetad::comm {

// Move-only owner of a CUDA or NCCL handle `H` released with `Destroy` (its result is ignored:
// a destructor has no one to tell).
template <typename H, auto Destroy>
class UniqueHandle {
 public:
  UniqueHandle() = default;
  ~UniqueHandle() {
    if (h_) Destroy(h_);
  }
  UniqueHandle(UniqueHandle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  UniqueHandle& operator=(UniqueHandle&& o) noexcept {
    std::swap(h_, o.h_);
    return *this;
  }
  UniqueHandle(const UniqueHandle&) = delete;
  UniqueHandle& operator=(const UniqueHandle&) = delete;
  H get() const { return h_; }
  explicit operator bool() const { return h_ != nullptr; }

 protected:
  H h_ = nullptr;
};

class CudaStream : public UniqueHandle<cudaStream_t, &cudaStreamDestroy> {
 public:
  CudaStream() = default;
  // Non-blocking (no implicit sync with the legacy default stream) at `priority`.
  explicit CudaStream(int priority) {
    CUDA_CHECK(cudaStreamCreateWithPriority(&h_, cudaStreamNonBlocking, priority));
  }
};

class CudaEvent : public UniqueHandle<cudaEvent_t, &cudaEventDestroy> {
 public:
  CudaEvent() { CUDA_CHECK(cudaEventCreateWithFlags(&h_, cudaEventDisableTiming)); }
};

// Owns an ncclComm_t: destroyed gracefully, or aborted (never hangs on a dead peer).
class NcclComm : public UniqueHandle<ncclComm_t, &ncclCommDestroy> {
 public:
  NcclComm() = default;
  NcclComm(int nranks, const ncclUniqueId& id, int rank) {
    NCCL_CHECK(ncclCommInitRank(&h_, nranks, id, rank));
  }
  // Makes every pending and future operation on it return; the handle is gone afterwards.
  void abort() {
    if (h_) ncclCommAbort(std::exchange(h_, nullptr));
  }
};

}  // namespace thetad::comm
