// A small persistent pool of worker threads for data-parallel loops over chunks (CPU Adam).
// Threads are started once and sleep between loops, so a step pays no thread start-up.
//
//   ThreadPool::instance().parallel_for(chunks, [&](size_t c) { work(c); });
#pragma once

#include <condition_variable>
#include <exception>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace thetad {

class ThreadPool {
 public:
  // threads = total threads taking part in a loop, the calling one included.
  explicit ThreadPool(size_t threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // The process-wide pool: by default sized to the CPUs this process may run on
  // (sched_getaffinity); configure() resizes it.
  static ThreadPool& instance();
  // Replaces the process-wide pool with one of `threads` threads (>= 1). Only while no loop
  // runs on it (startup); a reference from an earlier instance() must not be used afterwards.
  static void configure(size_t threads);
  // CPUs in this process's affinity mask.
  static size_t affinity_cpus();
  // A default for a process that shares the host with `local_ranks` processes: its affinity
  // mask, divided among the local ranks when every rank may run on every CPU (mpirun
  // --bind-to none), less one CPU for the rank's own training and communication threads.
  static size_t default_threads(int local_ranks);

  size_t threads() const { return workers_.size() + 1; }

  // Runs fn(0..chunks-1), each exactly once, on the workers and the calling thread; returns
  // when all are done. Concurrent callers take turns. fn must not throw.
  void parallel_for(size_t chunks, const std::function<void(size_t)>& fn);

 private:
  void worker_loop();
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex turn_;  // one loop at a time
  std::mutex mu_;
  std::condition_variable wake_, finished_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t chunks_ = 0;
  size_t next_ = 0;       // next chunk to hand out (under mu_)
  size_t busy_ = 0;       // workers still inside the current loop
  std::exception_ptr error_;  // the current loop's first exception (under mu_)
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace thetad
