// The thread pools (common/thread_pool.hpp): every chunk once, a chunk's exception at the caller,
// at most `most` threads in a loop, no thread started by a loop once the pool has its threads (a
// loop used to start its own), a loop from inside a loop of the same pool, and the CPU share of a
// rank.
#include <gtest/gtest.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include "common/thread_pool.hpp"

namespace thetad {
namespace {

// Threads seen for the first time: a thread_local starts fresh in every new thread, even where
// the system gives a new thread a finished one's id.
std::atomic<int> g_fresh{0};
void note_thread() {
  thread_local bool seen = false;
  if (!seen) g_fresh.fetch_add(1);
  seen = true;
}

// A chunk that throws (on whichever thread runs it) reaches parallel_for's caller once every
// thread is out of the loop, and the pool keeps working (it used to call std::terminate).
TEST(ThreadPool, ExceptionReachesTheCallerAndThePoolStaysUsable) {
  ThreadPool pool(4);
  for (size_t bad : {size_t{0}, size_t{37}, size_t{99}}) {
    std::atomic<int> ran{0};
    EXPECT_THROW(pool.parallel_for(100,
                                   [&](size_t c) {
                                     ran.fetch_add(1);
                                     if (c == bad) throw std::runtime_error("chunk " + std::to_string(c));
                                   }),
                 std::runtime_error);
    EXPECT_GE(ran.load(), 1);
    std::atomic<size_t> sum{0};
    pool.parallel_for(100, [&](size_t c) { sum.fetch_add(c); });
    EXPECT_EQ(sum.load(), 4950u);
  }
}

// `most` bounds the threads in the loop (a background checkpoint's share), the caller's included.
TEST(ThreadPool, LoopTakesAtMostItsThreads) {
  ThreadPool pool(6);
  for (size_t most : {size_t{1}, size_t{2}, size_t{4}, size_t{0}}) {
    std::atomic<int> inside{0}, peak{0};
    std::mutex mu;
    std::set<std::thread::id> ids;
    std::vector<int> done(200, 0);
    pool.parallel_for(done.size(), [&](size_t c) {
      const int now = inside.fetch_add(1) + 1;
      for (int p = peak.load(); now > p && !peak.compare_exchange_weak(p, now);) {
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      done[c] += 1;
      {
        std::lock_guard<std::mutex> lk(mu);
        ids.insert(std::this_thread::get_id());
      }
      inside.fetch_sub(1);
    }, most);
    EXPECT_EQ(std::count(done.begin(), done.end(), 1), 200) << most;
    const size_t bound = most == 0 ? pool.threads() : most;
    EXPECT_LE(static_cast<size_t>(peak.load()), bound) << most;
    EXPECT_LE(ids.size(), bound) << most;
  }
}

// A loop of n chunks in which every thread takes one: each chunk waits until n threads are in.
void rendezvous(ThreadPool& pool, size_t n) {
  std::atomic<size_t> inside{0};
  pool.parallel_for(n, [&](size_t) {
    note_thread();
    inside.fetch_add(1);
    const auto t0 = std::chrono::steady_clock::now();
    while (inside.load() < n && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) std::this_thread::yield();
  }, n);
  EXPECT_EQ(inside.load(), n);
}

// Loops reuse the pool's threads: once each has run a chunk, no loop starts a thread. The files
// pool grows once to what a loop asks for, never per loop.
TEST(ThreadPool, LoopsStartNoThreads) {
  const auto loop = [](ThreadPool& p, size_t most) {
    p.parallel_for(64, [](size_t) {
      note_thread();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }, most);
  };
  ThreadPool pool(4);
  rendezvous(pool, 4);  // the caller and the pool's 3 workers
  const int known = g_fresh.load();
  for (int i = 0; i < 50; ++i) loop(pool, i % 2 ? 2 : 0);
  EXPECT_EQ(g_fresh.load(), known) << "loops started threads of their own";

  ThreadPool& files = ThreadPool::files();
  rendezvous(files, 3);
  EXPECT_EQ(files.threads(), 3u);
  const int grown = g_fresh.load();
  for (int i = 0; i < 50; ++i) loop(files, i % 2 ? 3 : 2);
  EXPECT_EQ(g_fresh.load(), grown) << "loops started threads of their own";
  EXPECT_EQ(files.threads(), 3u);
}

// A chunk that starts a loop on its own pool gets it on its own thread (waiting for the pool's
// turn would never end); on the other pool it is an ordinary loop.
TEST(ThreadPool, LoopInsideALoopOfTheSamePoolRunsOnItsThread) {
  ThreadPool pool(3);
  std::atomic<size_t> sum{0};
  pool.parallel_for(8, [&](size_t c) {
    const auto me = std::this_thread::get_id();
    pool.parallel_for(10, [&](size_t d) {
      EXPECT_EQ(std::this_thread::get_id(), me);
      sum.fetch_add(c * 10 + d);
    });
    ThreadPool::files().parallel_for(4, [&](size_t) { sum.fetch_add(0); }, 2);
  });
  EXPECT_EQ(sum.load(), 3160u);  // 0..79
}

// A rank's CPU share: its affinity where it is bound, the host's CPUs over its ranks where not.
TEST(CpuShare, FromTheAffinityOrTheHostsCpusOverItsRanks) {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_GE(cpu_share(1), 1u);
  EXPECT_LE(cpu_share(1), static_cast<size_t>(cores));
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) == cores) {
    EXPECT_EQ(cpu_share(4 * cores), 1u);  // unbound, more ranks than cores: one each
    EXPECT_EQ(cpu_share(1), static_cast<size_t>(cores));
  }
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  std::thread([&] {  // a thread bound to one core (as mpirun binds a rank): one, whatever the ranks
    if (::sched_setaffinity(0, sizeof set, &set) == 0 && cores > 1) {
      EXPECT_EQ(cpu_share(1), 1u);
      EXPECT_EQ(cpu_share(4), 1u);
    }
  }).join();
}

}  // namespace
}  // namespace thetad
