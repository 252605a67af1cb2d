// Persistent worker pool for CPU Adam (see thread_pool.hpp).
#include "common/thread_pool.hpp"

#include <utility>

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <memory>

namespace thetad {

ThreadPool::ThreadPool(size_t threads) {
  for (size_t i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {
std::mutex g_instance_mu;
std::unique_ptr<ThreadPool> g_instance;
}  // namespace

size_t ThreadPool::affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  // The affinity mask, not hardware_concurrency: under mpirun --bind-to core a rank owns
  // only its cores, and more threads than that would fight each other.
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
    return static_cast<size_t>(CPU_COUNT(&set));
  const unsigned hc = std::thread::hardware_concurrency();
  return static_cast<size_t>(hc > 0 ? hc : 1);
}

size_t ThreadPool::default_threads(int local_ranks) {
  size_t cpus = affinity_cpus();
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  // Unbound ranks all see every CPU: split them, or each rank's pool oversubscribes the host
  // and preempts the threads that feed the GPU.
  if (local_ranks > 1 && online > 0 && cpus >= static_cast<size_t>(online))
    cpus = std::max<size_t>(1, cpus / static_cast<size_t>(local_ranks));
  return cpus > 2 ? cpus - 1 : cpus;
}

ThreadPool& ThreadPool::instance() {
  std::lock_guard<std::mutex> lk(g_instance_mu);
  if (!g_instance) g_instance = std::make_unique<ThreadPool>(affinity_cpus());
  return *g_instance;
}

void ThreadPool::configure(size_t threads) {
  std::lock_guard<std::mutex> lk(g_instance_mu);
  threads = std::max<size_t>(threads, 1);
  if (g_instance && g_instance->threads() == threads) return;
  g_instance = std::make_unique<ThreadPool>(threads);
}

void ThreadPool::run_chunks() {
  // Chunks are handed out one at a time so that a slow thread does not hold up the loop. The
  // first exception stops handing out chunks and goes to parallel_for's caller once every
  // thread is out of fn.
  for (;;) {
    size_t c;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (next_ >= chunks_) return;
      c = next_++;
    }
    try {
      (*fn_)(c);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      if (!error_) error_ = std::current_exception();
      next_ = chunks_;
    }
  }
}

void ThreadPool::parallel_for(size_t chunks, const std::function<void(size_t)>& fn) {
  if (chunks == 0) return;
  if (chunks == 1 || workers_.empty()) {
    for (size_t c = 0; c < chunks; ++c) fn(c);
    return;
  }
  std::lock_guard<std::mutex> turn(turn_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = &fn;
    chunks_ = chunks;
    next_ = 0;
    busy_ = workers_.size();
    ++generation_;
  }
  wake_.notify_all();
  run_chunks();
  std::unique_lock<std::mutex> lk(mu_);
  finished_.wait(lk, [this] { return busy_ == 0; });
  fn_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_chunks();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--busy_ == 0) finished_.notify_one();
    }
  }
}

}  // namespace thetad
