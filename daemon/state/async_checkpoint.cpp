// The background writer of an asynchronous checkpoint (see async_checkpoint.hpp).
#include "daemon/state/async_checkpoint.hpp"

#include <algorithm>
#include <cerrno>
#include <exception>

#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace thetad::daemon {

CheckpointInFlight::CheckpointInFlight(CheckpointWriter w, std::unique_ptr<CheckpointShare> share, double stall)
    : stall_ms(stall), snapshot_ms(stall), shared_(std::make_shared<Shared>()) {
  shared_->writer = std::move(w);
  shared_->share = std::move(share);
  start([](Shared& s) { write_share(s.writer, *s.share, s.status, &s.cancel); });
}

void CheckpointInFlight::publish_in_background() {
  thread_.join();  // done: returns at once
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->done = false;
  }
  start([](Shared& s) { publish_files(s.writer); });
}

namespace {
// A background write yields to training: this thread, and the writer threads it starts (Linux
// threads inherit their creator's nice value), run 10 nice levels below the trainer, so that they
// take the cores its threads leave idle rather than the one that feeds the GPU. A lower priority,
// not an idle class: on a machine whose cores the ranks keep busy, the write still progresses.
void lower_this_thread_priority() {
#ifdef __linux__
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int nice = ::getpriority(PRIO_PROCESS, tid);
  if (errno == 0) (void)::setpriority(PRIO_PROCESS, tid, std::min(19, nice + 10));
#endif
}
}  // namespace

void CheckpointInFlight::start(std::function<void(Shared&)> task) {
  // The thread keeps its own reference: an abandoned write still has its snapshot to read.
  thread_ = std::thread([s = shared_, task = std::move(task)] {
    lower_this_thread_priority();
    const auto t0 = std::chrono::steady_clock::now();
    try {
      task(*s);
    } catch (const std::exception& e) {  // write_share records its own; publish_files throws
      record_failure(s->status, e);
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(s->mu);
      s->write_ms += ms;
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
