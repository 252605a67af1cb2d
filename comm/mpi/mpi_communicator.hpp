// The MPI backend of Communicator: host buffers, a private duplicate of a parent communicator,
// and one progress thread (progress.hpp) that posts nonblocking collectives, sends and receives
// in submission order and polls them with MPI_Testsome, so a bucket is reduced while the caller
// keeps computing. In a world of one
// every collective is computed where it is called and returned complete: no trip through the
// progress thread (two thread hand-offs each; a one-rank step makes several: the count exchange,
// the stop and loss agreements).
//
// bf16 is supported through user-defined MPI ops (sum, max) that compute in float32 and round to
// nearest even. i32 with a divisor divides with C++ integer division (truncation).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "comm/communicator.hpp"

namespace thetad::comm {

class MpiProgress;  // the progress thread and its queue (progress.hpp)

class MpiCommunicator : public Communicator {
 public:
  // Duplicates `parent` (collective over it).
  explicit MpiCommunicator(MPI_Comm parent);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MemoryKind memory_kind() const override { return MemoryKind::host; }
  const char* backend_name() const override { return "mpi"; }

  WorkPtr allreduce(void* buf, size_t count, DType dtype, const AllreduceOptions& opts) override;
  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root, const CollectiveTag& tag) override;
  WorkPtr allgather(const void* send, void* recv, size_t count, DType dtype,
                    const CollectiveTag& tag) override;
  WorkPtr reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                         const CollectiveTag& tag) override;
  WorkPtr exchange(const std::vector<PeerOp>& ops, const CollectiveTag& tag) override;
  WorkPtr barrier(const CollectiveTag& tag) override;
  void abort(const std::string& why) override;

  std::shared_ptr<void> allocate(size_t bytes) override;
  void zero(void* ptr, size_t bytes) override;

 private:
  // A world of one that has not been aborted: collectives are computed where they are called.
  bool done_here() const;
  // The MPI tag of every send and receive (exchange).
  static constexpr int kPeerTag = 1;

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
  MPI_Op bf16_max_ = MPI_OP_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<MpiProgress> progress_;
};

}  // namespace thetad::comm
