// The background writer of an asynchronous checkpoint (see async_checkpoint.hpp).
#include "daemon/state/async_checkpoint.hpp"

#include <exception>

namespace thetad::daemon {

CheckpointInFlight::CheckpointInFlight(CheckpointWriter w, std::unique_ptr<CheckpointShare> share, double stall)
    : stall_ms(stall), shared_(std::make_shared<Shared>()) {
  shared_->writer = std::move(w);
  shared_->share = std::move(share);
  // The thread keeps its own reference: an abandoned write still has its snapshot to read.
  thread_ = std::thread([s = shared_] {
    const auto t0 = std::chrono::steady_clock::now();
    WriteStatus st;
    try {
      write_share(s->writer, *s->share, st, &s->cancel);
    } catch (const std::exception& e) {  // write_share records its own; anything else too
      st.ok = false;
      st.error = e.what();
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(s->mu);
      s->status = std::move(st);
      s->write_ms = ms;
      s->done = true;
    }
    s->cv.notify_all();
  });
}

CheckpointInFlight::~CheckpointInFlight() {
  shared_->cancel = true;
  if (wait(abandon_wait)) thread_.join();
  else thread_.detach();
}

bool CheckpointInFlight::done() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->done;
}

bool CheckpointInFlight::wait(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(shared_->mu);
  return shared_->cv.wait_for(lock, timeout, [this] { return shared_->done; });
}

}  // namespace thetad::daemon
