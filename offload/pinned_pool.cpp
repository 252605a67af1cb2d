// PinnedPool (see pinned_pool.hpp).
#include "offload/pinned_pool.hpp"

#include <cstdlib>

#include "common/errors.hpp"

namespace thetad::offload {

size_t PinnedPool::size_class(size_t bytes) {
  size_t c = 4096;
  while (c < bytes) c <<= 1;
  return c;
}

PinnedBuffer PinnedPool::get(size_t bytes) {
  const size_t cls = size_class(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(cls);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      return {p, cls};
    }
  }
  // Page-aligned, as cudaHostRegister pins whole pages.
  void* p = std::aligned_alloc(4096, cls);
  THETAD_CHECK(p != nullptr, ConfigError, "cannot allocate ", cls,
               " bytes of host memory for offloaded activations (offload.activations)");
  try {
    device_.pin_host(p, cls);
  } catch (...) {
    std::free(p);
    throw;
  }
  std::lock_guard<std::mutex> lock(mu_);
  all_.push_back({p, cls});
  ++allocations_;
  bytes_ += cls;
  return {p, cls};
}

bool PinnedPool::has_free(size_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = free_.find(size_class(bytes));
  return it != free_.end() && !it->second.empty();
}

void PinnedPool::put(PinnedBuffer buffer) {
  if (!buffer.ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  free_[buffer.bytes].push_back(buffer.ptr);
}

int64_t PinnedPool::allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocations_;
}

size_t PinnedPool::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

PinnedPool::~PinnedPool() {
  for (const auto& b : all_) {
    device_.unpin_host(b.ptr);
    std::free(b.ptr);
  }
}

}  // namespace thetad::offload
