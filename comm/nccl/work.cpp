// NcclWork and NcclCore::abort (see work.hpp).
#include "comm/nccl/work.hpp"

#include <thread>

#include "common/log.hpp"
#include "common/poll.hpp"

namespace thetad::comm {

void NcclCore::abort(const std::string& why, std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mu);
  abort_locked(why, std::move(error));
}

void NcclCore::abort_locked(const std::string& why, std::exception_ptr error) {
  if (aborted) return;
  aborted = true;
  abort_reason = why;
  THETAD_LOG(error, "comm") << "aborting NCCL communicator: " << why;
  // Fail the works first: once the communicator is aborted their kernels exit and their events
  // complete, and a waiter polling then must not mistake that for success.
  for (auto& w : outstanding) w->fail(error);
  outstanding.clear();
  comm.abort();
}

NcclWork::NcclWork(std::shared_ptr<NcclCore> core, uint64_t sequence, CollectiveTag tag)
    : core_(std::move(core)),
      sequence_(sequence),
      tag_(std::move(tag)),
      start_(core_->device, /*timing=*/true),
      done_(core_->device, /*timing=*/true) {}

double NcclWork::elapsed_ms() const {
  if (state_.load() != 1) return -1.0;
  float ms = 0;
  return cudaEventElapsedTime(&ms, start_.get(), done_.get()) == cudaSuccess ? static_cast<double>(ms) : -1.0;
}

void NcclWork::fail(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_.load() != 0) return;
  error_ = std::move(error);
  state_.store(2);
}

bool NcclWork::poll() {
  if (state_.load() != 0) return true;
  const cudaError_t rc = cudaEventQuery(done_.get());
  if (rc == cudaSuccess) {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_.load() == 0) state_.store(1);
    return true;
  }
  if (rc == cudaErrorNotReady) return false;
  fail(std::make_exception_ptr(InternalError(detail::concat(
      "CUDA error while waiting for ", describe_collective(sequence_, tag_), ": ", cudaGetErrorString(rc)))));
  return true;
}

bool NcclWork::is_completed() { return poll(); }

void NcclWork::wait(std::chrono::milliseconds timeout) {
  // A bucket takes ~0.1-2 ms: naps stay short.
  if (!poll_until([this] { return poll(); }, Clock::now() + timeout, std::chrono::microseconds(20))) {
    const std::string msg = timeout_message(sequence_, tag_, timeout);
    core_->abort(msg, std::make_exception_ptr(TimeoutError(msg)));
    throw TimeoutError(msg);
  }
  if (state_.load() == 2) {
    std::lock_guard<std::mutex> lock(mu_);
    std::rethrow_exception(error_);
  }
}

void NcclWork::block_stream(void* stream, std::chrono::milliseconds timeout) {
  (void)timeout;  // the watchdog enforces it: a stream cannot wait with a deadline
  if (state_.load() == 2) {
    std::lock_guard<std::mutex> lock(mu_);
    std::rethrow_exception(error_);
  }
  CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done_.get(), 0));
}

}  // namespace thetad::comm
