// HostDevice, the "auto" cache budget, and the CUDA factory's stub for builds without CUDA.
#include "offload/device.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "comm/bf16.hpp"
#include "common/errors.hpp"

namespace thetad::offload {

void* HostDevice::alloc(size_t bytes) {
  // 64-byte alignment like cudaMalloc's (>= 256 there), so vector code sees the same layout.
  void* p = std::aligned_alloc(64, (bytes + 63) & ~size_t{63});
  THETAD_CHECK(p != nullptr, ConfigError, "cannot allocate ", bytes,
               " bytes for a device slot (host device); lower offload.device_slots or "
               "offload.device_budget_mb");
  return p;
}

void HostDevice::free(void* ptr) noexcept { std::free(ptr); }

Fence HostDevice::h2d(void* dst, const void* src, size_t bytes, const Fence&) {
  std::memcpy(dst, src, bytes);
  return {};
}

Fence HostDevice::d2h(void* dst, const void* src, size_t bytes, const Fence&) {
  std::memcpy(dst, src, bytes);
  return {};
}

Fence HostDevice::widen_bf16(float* dst, const uint16_t* src, size_t n, const Fence&) {
  comm::from_bf16(src, dst, n);
  return {};
}

Fence HostDevice::d2d(void* dst, const void* src, size_t bytes, const Fence&) {
  std::memcpy(dst, src, bytes);
  return {};
}

Fence Device::d2d(void*, const void*, size_t, const Fence&) {
  throw InternalError(name() + " has no device-to-device copies");
}

std::string Device::share(void*) { throw InternalError(name() + " cannot share its memory with other processes"); }

void* Device::open_shared(const std::string&) {
  throw InternalError(name() + " cannot map memory of other processes");
}

size_t auto_cache_bytes(Device& device, bool after_a_step) {
  size_t free_bytes = 0, total = 0;
  if (!device.memory(&free_bytes, &total)) return 0;
  const size_t margin = std::max<size_t>(size_t{2} << 30, total / (after_a_step ? 10 : 5));
  return free_bytes > margin ? free_bytes - margin : 0;
}

#ifndef THETAD_WITH_CUDA
bool cuda_available() { return false; }

std::unique_ptr<Device> make_cuda_device(int, void*, int) {
  throw ConfigError("this thetad was built without CUDA; offload needs a GPU build for device "
                    "memory (or run on the host device)");
}
#endif

}  // namespace thetad::offload
