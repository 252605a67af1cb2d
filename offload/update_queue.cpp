// The owner's queue of CPU optimizer updates (see update_queue.hpp).
#include "offload/update_queue.hpp"

#include <chrono>
#include <cmath>

#include "common/clip.hpp"
#include "common/errors.hpp"
#include "offload/util.hpp"

namespace thetad::offload {

UpdateQueue::UpdateQueue(HostArena& arena, Device& device, bool async, double timeout_s, bool lowest_entry_first)
    : arena_(arena), device_(device), timeout_s_(timeout_s), lowest_entry_first_(lowest_entry_first) {
  if (async) worker_ = std::thread([this] { worker_loop(); });
}

UpdateQueue::~UpdateQueue() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void UpdateQueue::submit(size_t entry, const AdamHyper& hyper, std::vector<Fence> grads, uint64_t target) {
  enqueue(Job{entry, hyper, std::move(grads), target});
}

void UpdateQueue::submit_publish(size_t entry, std::vector<Fence> writes, uint64_t target) {
  enqueue(Job{entry, AdamHyper{}, std::move(writes), target, /*publish_only=*/true});
}

void UpdateQueue::enqueue(Job job) {
  if (!worker_.joinable()) {
    run(job);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void UpdateQueue::run(Job& job) {
  for (const Fence& f : job.grads) device_.host_wait(f);
  const size_t gi = job.entry;
  const uint64_t before = arena_.seq(gi).load(std::memory_order_acquire);
  if (job.publish_only) {  // the device's updates, one publish each (readers wait for the last)
    THETAD_CHECK(before <= job.target, InternalError, "offload: group published back in time");
    arena_.refresh_bf16(gi);  // the device's values just landed in params
    for (uint64_t s = before; s < job.target; ++s) arena_.publish(gi);
    return;
  }
  THETAD_CHECK_EQ(before + 1, job.target, "offload: group updates out of order");
  const auto t0 = std::chrono::steady_clock::now();
  AdamHyper h = job.hyper;
  if (h.clip_norm > 0) {  // the reduced gradient is here whole: clip by its norm
    const double norm = std::sqrt(sum_squares(arena_.grad(gi), arena_.entry(gi).numel));
    h.grad_scale = clip_factor(norm, h.clip_norm);
  }
  adam_step(arena_.params(gi), arena_.grad(gi), arena_.exp_avg(gi), arena_.exp_avg_sq(gi),
            arena_.entry(gi).numel, h, arena_.params_bf16(gi));
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  arena_.publish(gi);
  std::lock_guard<std::mutex> lk(mu_);
  cpu_adam_ms_ += ms;
  steps_ += 1;
}

void UpdateQueue::worker_loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop requested and nothing left
      const auto it = queue_.begin() + static_cast<std::ptrdiff_t>(next_job());
      job = std::move(*it);
      queue_.erase(it);
      busy_ = true;
    }
    try {
      run(job);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      if (!error_) error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      busy_ = false;
    }
    idle_.notify_all();
  }
}

// The oldest job, or with lowest_entry_first the lowest entry among those ready to run (copies
// landed, no earlier job of the same entry queued); the oldest if none is ready (run waits).
size_t UpdateQueue::next_job() const {
  if (!lowest_entry_first_) return 0;
  size_t best = 0;
  bool found = false;
  for (size_t i = 0; i < queue_.size(); ++i) {
    const Job& j = queue_[i];
    if (found && j.entry >= queue_[best].entry) continue;
    bool ready = true;
    for (size_t k = 0; k < i && ready; ++k) ready = queue_[k].entry != j.entry;
    for (const Fence& f : j.grads) ready = ready && device_.done(f);
    if (ready) best = i, found = true;
  }
  return best;
}

// Where this rank is the owner, a failure of its own worker ends the wait with that error (not
// with a timeout).
void UpdateQueue::wait_update(size_t entry, uint64_t expected) {
  const bool mine = arena_.is_owner(entry);
  arena_.wait_seq(entry, expected, timeout_s_, [this, mine] {
    if (mine) rethrow_error();
  });
}

void UpdateQueue::rethrow_error() {
  std::lock_guard<std::mutex> lk(mu_);
  if (error_) std::rethrow_exception(error_);
}

void UpdateQueue::wait_idle() {
  if (worker_.joinable()) {
    std::unique_lock<std::mutex> lk(mu_);
    const auto settled = [this] { return (queue_.empty() && !busy_) || error_; };
    if (timeout_s_ > 0) {
      const auto start = std::chrono::steady_clock::now();
      if (!idle_.wait_for(lk, std::chrono::duration<double>(timeout_s_), settled))
        throw TimeoutError(::thetad::detail::concat(
            "offload: waited ",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
            " s for this rank's queued optimizer steps (", queue_.size() + (busy_ ? 1 : 0),
            " not done); its optimizer thread is stuck"));
    } else {
      idle_.wait(lk, settled);
    }
  }
  rethrow_error();
}

double UpdateQueue::cpu_adam_ms() const {
  std::lock_guard<std::mutex> lk(mu_);
  return cpu_adam_ms_;
}

uint64_t UpdateQueue::steps() const {
  std::lock_guard<std::mutex> lk(mu_);
  return steps_;
}

}  // namespace thetad::offload
