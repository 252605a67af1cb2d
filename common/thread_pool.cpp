// Persistent pools of worker threads and the CPU share of a rank (see thread_pool.hpp).
#include "common/thread_pool.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <system_error>
#include <utility>

namespace thetad {
namespace {

// The pool whose loop the current thread is running (a worker's, or a caller's during its loop):
// a loop started from inside it runs serially instead of waiting for its own turn forever.
thread_local const ThreadPool* t_running = nullptr;

// CPUs in this process's affinity mask (the host's CPUs where the mask cannot be read).
size_t affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return static_cast<size_t>(CPU_COUNT(&set));
  const unsigned hc = std::thread::hardware_concurrency();
  return static_cast<size_t>(hc > 0 ? hc : 1);
}

std::mutex g_instance_mu;
std::unique_ptr<ThreadPool> g_instance;

}  // namespace

size_t cpu_share(int local_ranks) {
  const size_t mine = affinity_cpus();
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  // Unbound ranks all see every CPU: split them, or each rank's threads oversubscribe the host
  // and preempt the threads that feed the GPU.
  if (local_ranks > 1 && online > 0 && mine >= static_cast<size_t>(online))
    return std::max<size_t>(1, static_cast<size_t>(online) / static_cast<size_t>(local_ranks));
  return std::max<size_t>(1, mine);
}

size_t cpu_adam_threads(int64_t configured, int local_ranks) {
  if (configured > 0) return static_cast<size_t>(configured);
  const size_t share = cpu_share(local_ranks);
  return share > 2 ? share - 1 : share;
}

ThreadPool::ThreadPool(size_t threads) { grow(std::max<size_t>(threads, 1)); }

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
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

ThreadPool& ThreadPool::files() {
  static ThreadPool* pool = [] {
    auto* p = new ThreadPool(1);  // never destroyed: a writer may still use it while the process exits
    p->grows_ = true;
    return p;
  }();
  return *pool;
}

size_t ThreadPool::threads() const {
  std::lock_guard<std::mutex> lk(mu_);
  return workers_.size() + 1;
}

void ThreadPool::grow(size_t threads) {
  std::lock_guard<std::mutex> lk(mu_);
  // A new worker starts at the current generation: it waits for the next loop.
  while (workers_.size() + 1 < threads) workers_.emplace_back([this, g = generation_] { worker_loop(g); });
}

void ThreadPool::run_chunks() {
  // Chunks are handed out one at a time so that a slow thread does not hold up the loop.
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

void ThreadPool::parallel_for(size_t chunks, const std::function<void(size_t)>& fn, size_t most) {
  if (chunks == 0) return;
  if (chunks == 1 || most == 1 || t_running == this) {
    for (size_t c = 0; c < chunks; ++c) fn(c);
    return;
  }
  std::lock_guard<std::mutex> turn(turn_);
  if (grows_ && most > 0) {
    try {
      grow(std::min(most, chunks));
    } catch (const std::system_error&) {
      // No more threads can be made (ulimit -u, -v): the ones there are do the work.
    }
  }
  bool alone = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    alone = workers_.empty();
    if (!alone) {
      fn_ = &fn;
      chunks_ = chunks;
      next_ = 0;
      helpers_ = std::min({workers_.size(), chunks - 1, most > 0 ? most - 1 : workers_.size()});
      busy_ = workers_.size();
      ++generation_;
    }
  }
  if (alone) {
    for (size_t c = 0; c < chunks; ++c) fn(c);
    return;
  }
  wake_.notify_all();
  const ThreadPool* outer = std::exchange(t_running, this);
  run_chunks();
  t_running = outer;
  std::unique_lock<std::mutex> lk(mu_);
  finished_.wait(lk, [this] { return busy_ == 0; });
  fn_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void ThreadPool::worker_loop(uint64_t seen) {
  t_running = this;
  for (;;) {
    bool helps = false;
    {
      std::unique_lock<std::mutex> lk(mu_);
      wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (helpers_ > 0) {
        --helpers_;
        helps = true;
      }
    }
    if (helps) run_chunks();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--busy_ == 0) finished_.notify_one();
    }
  }
}

}  // namespace thetad
