// MpiWork: see work.hpp.
#include "comm/mpi/work.hpp"

#include "common/errors.hpp"

namespace thetad::comm {

MpiWork::MpiWork(uint64_t sequence, CollectiveTag tag, OnTimeout on_timeout)
    : sequence_(sequence), tag_(std::move(tag)), on_timeout_(std::move(on_timeout)) {}

bool MpiWork::is_completed() {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ != State::pending;
}

void MpiWork::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return state_ != State::pending; })) {
    lock.unlock();
    const std::string msg = timeout_message(sequence_, tag_, timeout);
    // Fails this and every other pending work of the communicator, so nobody waits again.
    if (on_timeout_) on_timeout_(msg);
    throw TimeoutError(msg);
  }
  if (state_ == State::failed) std::rethrow_exception(error_);
}

double MpiWork::elapsed_ms() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::done) return -1.0;
  return std::chrono::duration<double, std::milli>(finished_ - launched_).count();
}

void MpiWork::complete() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::pending) return;
    state_ = State::done;
    finished_ = Clock::now();
  }
  cv_.notify_all();
}

void MpiWork::fail(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::pending) return;
    state_ = State::failed;
    error_ = std::move(error);
    finished_ = Clock::now();
  }
  cv_.notify_all();
}

}  // namespace thetad::comm
