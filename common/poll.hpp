// The one poll-with-backoff wait: for a condition that only polling can observe (a CUDA event,
// an NCCL collective, a sequence number another process bumps in shared memory). It yields
// for the first polls (what we wait for is often microseconds away), then sleeps between polls,
// doubling the nap up to `max_nap` so that long waits leave the cores to the threads doing the
// work.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace thetad {

// Polls done() until it is true (returns true) or `deadline` passes (returns false; done() was
// false at its last poll). between() runs after each nap and may throw, ending the wait.
template <typename Done, typename Between>
bool poll_until(Done&& done, std::chrono::steady_clock::time_point deadline, std::chrono::microseconds max_nap,
                Between&& between) {
  constexpr int kYields = 64;
  auto nap = std::chrono::microseconds(5);
  for (int polls = 0;; ++polls) {
    if (done()) return true;
    if (polls < kYields) {
      std::this_thread::yield();
      continue;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, max_nap);
    between();
  }
}

template <typename Done>
bool poll_until(Done&& done, std::chrono::steady_clock::time_point deadline, std::chrono::microseconds max_nap) {
  return poll_until(std::forward<Done>(done), deadline, max_nap, [] {});
}

}  // namespace thetad
