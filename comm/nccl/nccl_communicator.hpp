// The NCCL backend of Communicator: device buffers, a move-only RAII ncclComm_t, a dedicated
// high-priority communication stream ordered after the compute stream by CUDA events (never a
// device-wide synchronize), and a watchdog thread that aborts the communicator when a collective
// outlives the timeout or NCCL reports an asynchronous error. Compiled only with THETAD_WITH_CUDA.
//
// Per collective:  compute stream --event--> comm stream: nccl op --> completion event (the Work).
// The divisor is fused as ncclRedOpCreatePreMulSum(1/divisor); int32 takes no divisor here.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/communicator.hpp"
#include "comm/nccl/work.hpp"

namespace thetad::comm {

class NcclCommunicator : public Communicator {
 public:
  // `id` points to an ncclUniqueId that every rank received from rank 0.
  NcclCommunicator(int rank, int size, const void* id, int device);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MemoryKind memory_kind() const override { return MemoryKind::device; }
  const char* backend_name() const override { return "nccl"; }
  bool completes_in_order() const override { return true; }  // all on the comm stream

  WorkPtr allreduce(void* buf, size_t count, DType dtype, const AllreduceOptions& opts) override;
  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root, const CollectiveTag& tag) override;
  WorkPtr allgather(const void* send, void* recv, size_t count, DType dtype,
                    const CollectiveTag& tag) override;
  WorkPtr reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                         const CollectiveTag& tag) override;
  WorkPtr exchange(const std::vector<PeerOp>& ops, const CollectiveTag& tag) override;
  WorkPtr barrier(const CollectiveTag& tag) override;
  WorkPtr after_compute(const CollectiveTag& tag) override;
  void abort(const std::string& why) override;
  void set_compute_stream(void* stream) override;

  std::shared_ptr<void> allocate(size_t bytes) override;
  void zero(void* ptr, size_t bytes) override;
  void divide(float* buf, size_t count, double divisor) override;
  void copy_from_host(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;

  int device() const { return core_->device; }
  void* comm_stream() const { return core_->comm_stream.get(); }

 private:
  // Runs `enqueue(comm, stream)` on the comm stream after the compute stream (if asked), then
  // records the returned work's completion event. Holds the core's mutex throughout.
  template <typename F>
  WorkPtr launch(CollectiveTag tag, bool after_compute, F&& enqueue);
  void watchdog();

  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<NcclCore> core_;
  std::shared_ptr<void> barrier_buf_;
  // The bf16 wire of AllreduceOptions::wire: one buffer, used on the comm stream only (so stream
  // order makes every reuse safe), grown to the largest bucket sent that way. Guarded by core_->mu.
  uint16_t* wire_buffer(size_t count);
  std::shared_ptr<void> wire_buf_;
  size_t wire_count_ = 0;
  // copy_from_host's source, copied into pinned memory of ours before the device copy is queued:
  // CUDA says only that a cudaMemcpyAsync from pageable memory *might* return after reading it,
  // and a count exchange's flags are a vector freed on return (its heap reused for gradients at
  // once). `stage_done_` marks the device copy's end, which the next copy waits for before it
  // writes the staging memory again. Guarded by stage_mu_ (taken before core_->mu).
  std::mutex stage_mu_;
  std::shared_ptr<void> stage_buf_;
  size_t stage_bytes_ = 0;
  CudaEvent stage_done_;
  bool stage_pending_ = false;
  std::mutex wd_mu_;
  std::condition_variable wd_cv_;
  bool wd_stop_ = false;
  std::thread wd_thread_;
};

}  // namespace thetad::comm
