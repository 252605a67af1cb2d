// The NCCL backend's Work and the state it shares with its communicator (NcclCore): a completion
// event recorded on the communication stream, polled by wait() and by the watchdog (and a start
// event before the operation, for its device time); the communicator's abort fails every
// outstanding work.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/nccl/handles.hpp"

namespace thetad::comm {

class NcclWork;

// Shared by the communicator, its works and its watchdog; guarded by `mu` (NCCL calls on one
// communicator must not race).
struct NcclCore {
  std::mutex mu;
  int device = 0;
  NcclComm comm;
  CudaStream comm_stream;   // collectives, high priority
  CudaStream copy_stream;   // small control copies (count exchange), never waits for compute
  cudaStream_t compute_stream = nullptr;
  bool aborted = false;
  std::string abort_reason;
  std::vector<std::shared_ptr<NcclWork>> outstanding;

  // Aborts the NCCL communicator and fails every outstanding work with `error`. Locks `mu`.
  void abort(const std::string& why, std::exception_ptr error);
  // Same, with `mu` already held.
  void abort_locked(const std::string& why, std::exception_ptr error);
};

class NcclWork : public Work {
 public:
  using Clock = std::chrono::steady_clock;
  NcclWork(std::shared_ptr<NcclCore> core, uint64_t sequence, CollectiveTag tag);

  bool is_completed() override;
  // Polls the completion event; past `timeout` aborts the communicator and throws TimeoutError.
  void wait(std::chrono::milliseconds timeout) override;
  // cudaStreamWaitEvent: `stream` waits on the device, the host does not.
  void block_stream(void* stream, std::chrono::milliseconds timeout) override;
  uint64_t sequence() const override { return sequence_; }
  // The device time between the start and the completion events, once completed.
  double elapsed_ms() const override;

  cudaEvent_t event() const { return done_.get(); }
  cudaEvent_t start_event() const { return start_.get(); }
  const CollectiveTag& tag() const { return tag_; }
  Clock::time_point launched() const { return launched_; }
  // Queries the event; true once finished (or failed). Records failures of the query itself.
  bool poll();
  void fail(std::exception_ptr error);

 private:
  std::shared_ptr<NcclCore> core_;
  const uint64_t sequence_;
  const CollectiveTag tag_;
  const Clock::time_point launched_ = Clock::now();
  CudaEvent start_;  // recorded where the communication stream reaches the operation (timing)
  CudaEvent done_;   // after it (timing)
  std::atomic<int> state_{0};  // 0 pending, 1 done, 2 failed
  std::mutex mu_;
  std::exception_ptr error_;
};

}  // namespace thetad::comm
