// The NCCL check macro and the move-only owner of the NCCL communicator (CUDA streams and
// events: common/cuda_handles.hpp).
// Compiled only with THETAD_WITH_CUDA.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <utility>

#include "common/cuda_check.hpp"
#include "common/cuda_handles.hpp"
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

// Owns an ncclComm_t: destroyed gracefully, or aborted (never hangs on a dead peer).
class NcclComm {
 public:
  NcclComm() = default;
  ~NcclComm() {
    if (h_) ncclCommDestroy(h_);
  }
  NcclComm(NcclComm&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  NcclComm& operator=(NcclComm&& o) noexcept {
    std::swap(h_, o.h_);
    return *this;
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ncclComm_t get() const { return h_; }
  explicit operator bool() const { return h_ != nullptr; }
  NcclComm(int nranks, const ncclUniqueId& id, int rank) {
    NCCL_CHECK(ncclCommInitRank(&h_, nranks, id, rank));
  }
  // Makes every pending and future operation on it return; the handle is gone afterwards.
  void abort() {
    if (h_) ncclCommAbort(std::exchange(h_, nullptr));
  }

 private:
  ncclComm_t h_ = nullptr;
};

// The CUDA handles of the backend (common/cuda_handles.hpp).
using thetad::CudaEvent;
using thetad::CudaStream;

}  // namespace thetad::comm
