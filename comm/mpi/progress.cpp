// MpiProgress (see progress.hpp).
#include "comm/mpi/progress.hpp"

#include "comm/mpi_check.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"

namespace thetad::comm {

MpiProgress::Op MpiProgress::single(std::shared_ptr<MpiWork> work, std::function<int(MPI_Request*)> post,
                                    std::function<void()> finish) {
  Op op;
  op.work = std::move(work);
  op.post = [post = std::move(post)](std::vector<MPI_Request>& reqs) {
    MPI_Request req = MPI_REQUEST_NULL;
    const int rc = post(&req);
    if (rc == MPI_SUCCESS) reqs.push_back(req);
    return rc;
  };
  op.finish = std::move(finish);
  return op;
}

void MpiProgress::start() { thread_ = std::thread([this] { run(); }); }

void MpiProgress::submit(Op op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) {
      op.work->fail(std::make_exception_ptr(CommError("communicator was aborted: " + why_)));
      return;
    }
    queue_.push_back(std::move(op));
  }
  cv_.notify_one();
}

void MpiProgress::abort(const std::string& why, std::exception_ptr error) {
  std::vector<std::shared_ptr<MpiWork>> victims;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    aborted_ = true;
    why_ = why;
    for (Op& op : queue_) victims.push_back(op.work);
    queue_.clear();
    for (auto& w : inflight_) victims.push_back(w);
  }
  THETAD_LOG(error, "comm") << "aborting MPI communicator: " << why;
  for (auto& w : victims) w->fail(error);
  cv_.notify_one();
}

bool MpiProgress::aborted() {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

bool MpiProgress::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
  return reqs_.empty();
}

void MpiProgress::run() {
  auto drain_deadline = std::chrono::steady_clock::time_point::max();
  for (;;) {
    std::deque<Op> to_post;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (reqs_.empty() && queue_.empty() && !stop_) cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) {
        if (reqs_.empty()) return;
        if (drain_deadline == std::chrono::steady_clock::time_point::max())
          drain_deadline = std::chrono::steady_clock::now() + kDrain;
        if (std::chrono::steady_clock::now() > drain_deadline) {
          THETAD_LOG(warn, "comm") << reqs_.size() << " MPI request(s) still in flight at shutdown; leaking them";
          return;
        }
      }
      to_post.swap(queue_);
    }
    for (Op& op : to_post) post(op);
    if (!test()) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, kIdlePoll, [&] { return !queue_.empty() || stop_; });
    }
  }
}

void MpiProgress::post(Op& op) {
  auto posted = std::make_shared<Posted>();
  posted->op = std::move(op);
  std::vector<MPI_Request> reqs;
  try {
    const int rc = posted->op.post(reqs);
    if (rc != MPI_SUCCESS) {
      const MpiWork& w = *posted->op.work;
      throw_mpi_error(rc, __FILE__, __LINE__, describe_collective(w.sequence(), w.tag()).c_str());
    }
  } catch (...) {
    posted->op.work->fail(std::current_exception());
    posted->failed = true;
  }
  // Requests posted before a failure stay tracked: their buffers are in use until they finish.
  posted->remaining = reqs.size();
  for (MPI_Request r : reqs) {
    reqs_.push_back(r);
    owner_.push_back(posted);
  }
  if (reqs.empty() && !posted->failed) {  // nothing to wait for (an exchange of no ops)
    if (posted->op.finish) posted->op.finish();
    posted->op.work->complete();
    return;
  }
  track_inflight();
}

// The works of the requests in flight, for abort (each once).
void MpiProgress::track_inflight() {
  std::lock_guard<std::mutex> lock(mu_);
  inflight_.clear();
  for (size_t i = 0; i < owner_.size(); ++i)
    if (i == 0 || owner_[i] != owner_[i - 1]) inflight_.push_back(owner_[i]->op.work);
}

bool MpiProgress::test() {
  if (reqs_.empty()) return false;
  const int n = static_cast<int>(reqs_.size());
  int outcount = 0;
  indices_.resize(static_cast<size_t>(n));
  const int rc = MPI_Testsome(n, reqs_.data(), &outcount, indices_.data(), MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS) {
    // Which request failed is not reported reliably; none of them can be trusted any more.
    std::exception_ptr err;
    try {
      throw_mpi_error(rc, __FILE__, __LINE__, "MPI_Testsome");
    } catch (...) {
      err = std::current_exception();
    }
    for (auto& p : owner_) p->op.work->fail(err);
    abort("an MPI request failed", err);
    reqs_.clear();
    owner_.clear();
    std::lock_guard<std::mutex> lock(mu_);
    inflight_.clear();
    return true;
  }
  if (outcount == MPI_UNDEFINED || outcount == 0) return false;
  const bool dropped = aborted();
  std::vector<bool> done(static_cast<size_t>(n), false);
  for (int k = 0; k < outcount; ++k) {
    const auto i = static_cast<size_t>(indices_[static_cast<size_t>(k)]);
    done[i] = true;
    Posted& p = *owner_[i];
    if (--p.remaining > 0 || p.failed || dropped) continue;  // dropped: its work already failed
    try {
      if (p.op.finish) p.op.finish();
      p.op.work->complete();
    } catch (...) {
      p.op.work->fail(std::current_exception());
    }
  }
  // Compact: keep the requests that are still active, in posting order.
  size_t j = 0;
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    if (done[i]) continue;
    reqs_[j] = reqs_[i];
    owner_[j] = std::move(owner_[i]);
    ++j;
  }
  reqs_.resize(j);
  owner_.resize(j);
  track_inflight();
  return true;
}

std::shared_ptr<MpiWork> new_mpi_work(const std::shared_ptr<MpiProgress>& progress, uint64_t sequence,
                                      CollectiveTag tag) {
  return std::make_shared<MpiWork>(sequence, std::move(tag), [p = std::weak_ptr<MpiProgress>(progress)](const std::string& why) {
    if (auto s = p.lock()) s->abort(why, std::make_exception_ptr(TimeoutError(why)));
  });
}

}  // namespace thetad::comm
