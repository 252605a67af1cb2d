// The owner's optimizer updates: the CPU Adam steps step_group queues for the groups this rank
// owns, run in order on one worker thread (or inline without async_step), each publishing the
// group's new sequence number in the host arena. Waits for a group's update (any owner's, via
// the arena) or for the queue to drain are bounded by the store's timeout, and a failure of this
// rank's worker ends them with that error.
//
//   UpdateQueue q(arena, device, /*async=*/true, timeout_s);
//   q.submit(entry, hyper, std::move(grad_fences), expected);   // owner only
//   q.wait_update(entry, expected);                             // any rank
//   q.wait_idle();
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "offload/cpu_adam.hpp"
#include "offload/device.hpp"
#include "offload/host_arena.hpp"

namespace thetad::offload {

class UpdateQueue {
 public:
  // `lowest_entry_first`: of the queued updates whose copies have landed, the lowest entry runs
  // next (else the oldest); none overtakes an earlier one of its own entry.
  UpdateQueue(HostArena& arena, Device& device, bool async, double timeout_s, bool lowest_entry_first = false);
  // Runs what is queued, then stops the worker.
  ~UpdateQueue();
  UpdateQueue(const UpdateQueue&) = delete;
  UpdateQueue& operator=(const UpdateQueue&) = delete;

  // Owner: the entry's update number `target` once the gradient copies `grads` have landed.
  // Updates of an entry must be submitted in order (InternalError otherwise, when it runs).
  void submit(size_t entry, const AdamHyper& hyper, std::vector<Fence> grads, uint64_t target);
  // Owner: once the copies `writes` into the entry (a group back from the device cache, updated
  // there up to `target`) have landed, publishes update number `target` without a CPU step.
  void submit_publish(size_t entry, std::vector<Fence> writes, uint64_t target);
  // Until the entry's sequence number reaches `expected` (TimeoutError after timeout_s naming
  // the group and its owner); where this rank owns it, the worker's failure ends the wait.
  void wait_update(size_t entry, uint64_t expected);
  // Until every submitted update ran (TimeoutError after timeout_s); rethrows the worker's error.
  void wait_idle();
  // The worker's first failure, if any.
  void rethrow_error();

  double cpu_adam_ms() const;
  uint64_t steps() const;

 private:
  struct Job {
    size_t entry;
    AdamHyper hyper;
    std::vector<Fence> grads;
    uint64_t target;
    bool publish_only = false;  // submit_publish: no optimizer step
  };
  void enqueue(Job job);
  void run(Job& job);
  void worker_loop();
  size_t next_job() const;  // under mu_, queue_ not empty

  HostArena& arena_;
  Device& device_;
  const double timeout_s_;
  const bool lowest_entry_first_;

  mutable std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<Job> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  double cpu_adam_ms_ = 0.0;  // under mu_
  uint64_t steps_ = 0;        // under mu_
  std::thread worker_;
};

}  // namespace thetad::offload
