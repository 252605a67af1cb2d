// Page-locked host buffers that are kept and reused: the host side of memory that leaves the
// device for a while (a trunk layer's saved activations between its forward and its backward).
// Buffers come in power-of-two size classes, so a workload whose sizes repeat from step to step
// allocates during its first step only and then reuses (allocations() stops growing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "offload/device.hpp"

namespace thetad::offload {

struct PinnedBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;  // the buffer's capacity (its size class), >= what was asked for
};

class PinnedPool {
 public:
  // `device` pins (and unpins) the buffers; it must outlive the pool.
  explicit PinnedPool(Device& device) : device_(device) {}
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // A buffer of at least `bytes`: a free one of its size class, else a new pinned allocation.
  PinnedBuffer get(size_t bytes);
  // Whether get(bytes) would hand out a free buffer (no new allocation).
  bool has_free(size_t bytes) const;
  // Gives a buffer from get() back for reuse (the caller's copies from or into it are complete).
  void put(PinnedBuffer buffer);

  // Host allocations made so far (each one pinned); constant once the pool has warmed up.
  int64_t allocations() const;
  // Pinned bytes the pool owns, free or handed out.
  size_t bytes() const;

  // The size class of a request: a power of two, at least 4 KiB.
  static size_t size_class(size_t bytes);

 private:
  Device& device_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // size class -> free buffers
  std::vector<PinnedBuffer> all_;
  int64_t allocations_ = 0;
  size_t bytes_ = 0;
};

}  // namespace thetad::offload
