// Persistent pools of worker threads for data-parallel loops over chunks, and the one rule for
// how many CPUs a rank may keep busy (cpu_share). A pool's threads start once and sleep between
// loops, so that a loop pays no thread start-up; a loop may take fewer of them than the pool has.
//
//   ThreadPool::instance().parallel_for(chunks, [&](size_t c) { work(c); });         // every thread
//   ThreadPool::files().parallel_for(blocks, [&](size_t b) { write(b); }, threads);  // at most `threads`
//
// Two pools, each for loops that must never wait for the other's: instance(), the CPU work of
// training (the owner's CPU AdamW, the host arena's faulting and pinning, the groups' initial
// values, a base read from safetensors, the final hash), sized by the store once it knows its share
// (configure); files(), the checkpoint files' work (the snapshot's host copies, each block copied,
// checksummed and written, the checksums resume and publishing read), which a background checkpoint
// runs while the first pool updates the next step's groups. A pool runs one loop at a time:
// concurrent callers take turns, and a loop started from inside one of its own loops runs on the
// calling thread alone.
// Torch-free.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace thetad {

class ThreadPool {
 public:
  // threads = the most threads a loop of this pool uses, the calling one included (>= 1).
  explicit ThreadPool(size_t threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // The pool of training's CPU work: by default the CPUs this process may run on (its affinity
  // mask); configure() resizes it (the trainer to the rank's cpu_share when it starts, a host
  // store to its CPU AdamW threads).
  static ThreadPool& instance();
  // Replaces instance() with a pool of `threads` threads (>= 1). Only while no loop runs on it
  // (start-up); a reference from an earlier instance() must not be used afterwards.
  static void configure(size_t threads);
  // The pool of checkpoint files' work. It starts with the calling thread alone and grows, once,
  // to the most threads a loop asks for (its `most`).
  static ThreadPool& files();

  size_t threads() const;

  // Runs fn(0..chunks-1), each exactly once, on the calling thread and up to `most` - 1 of the
  // pool's workers (most = 0: all of them; a pool that is smaller grows to `most` first, except
  // instance(), whose size configure() decides); returns when all are done. The first exception
  // stops the handing out of chunks and is rethrown here once every thread is out of fn.
  void parallel_for(size_t chunks, const std::function<void(size_t)>& fn, size_t most = 0);

 private:
  void worker_loop(uint64_t seen);
  void run_chunks();
  void grow(size_t threads);  // under turn_, no loop running

  bool grows_ = false;  // files(): grows to what a loop asks for
  std::vector<std::thread> workers_;
  std::mutex turn_;  // one loop at a time
  mutable std::mutex mu_;
  std::condition_variable wake_, finished_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t chunks_ = 0;
  size_t next_ = 0;       // next chunk to hand out (under mu_)
  size_t helpers_ = 0;    // workers that may still join the current loop (under mu_)
  size_t busy_ = 0;       // workers still inside the current loop (under mu_)
  std::exception_ptr error_;  // the current loop's first exception (under mu_)
  uint64_t generation_ = 0;
  bool stop_ = false;
};

// The CPUs a rank may keep busy: those it is bound to (its affinity mask, under mpirun's or
// Slurm's binding), or where it is not bound (its mask is every CPU of the host), the host's CPUs
// shared among its `local_ranks` ranks. At least 1. The one rule for every pool's size: the CPU
// AdamW threads (less one for the rank's own training threads, offload.cpu_threads unset) and
// the checkpoint files' threads.
size_t cpu_share(int local_ranks);
// A host store's CPU AdamW threads: `configured` (offload.cpu_threads) where > 0, else the rank's
// cpu_share less one for its own training and communication threads (from 3 CPUs on).
size_t cpu_adam_threads(int64_t configured, int local_ranks);

}  // namespace thetad
