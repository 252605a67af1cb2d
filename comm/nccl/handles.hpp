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

class CudaStream {
 public:
  CudaStream() = default;
  // Non-blocking (no implicit sync with the legacy default stream) at `priority`.
  explicit CudaStream(int priority) {
    CUDA_CHECK(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, priority));
  }
  ~CudaStream() {
    if (s_) cudaStreamDestroy(s_);
  }
  CudaStream(CudaStream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  CudaStream& operator=(CudaStream&& o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class CudaEvent {
 public:
  CudaEvent() { CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  ~CudaEvent() {
    if (e_) cudaEventDestroy(e_);
  }
  CudaEvent(CudaEvent&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// Owns an ncclComm_t: destroyed gracefully, or aborted (never hangs on a dead peer).
class NcclComm {
 public:
  NcclComm() = default;
  NcclComm(int nranks, const ncclUniqueId& id, int rank) {
    NCCL_CHECK(ncclCommInitRank(&c_, nranks, id, rank));
  }
  ~NcclComm() {
    if (c_) ncclCommDestroy(c_);
  }
  NcclComm(NcclComm&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  NcclComm& operator=(NcclComm&& o) noexcept {
    std::swap(c_, o.c_);
    return *this;
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ncclComm_t get() const { return c_; }
  explicit operator bool() const { return c_ != nullptr; }
  // Makes every pending and future operation on it return; the handle is gone afterwards.
  void abort() {
    if (c_) ncclCommAbort(std::exchange(c_, nullptr));
  }

 private:
  ncclComm_t c_ = nullptr;
};

}  // namespace thetad::comm
