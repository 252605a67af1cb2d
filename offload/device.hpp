// The device side of the parameter store, behind a small interface: slot memory, the
// host->device and device->host copy streams, and fences that order them against compute.
//
//   HostDevice  — ordinary memory and memcpy; CPU machines and CI. Copies finish on return.
//   CudaDevice  — cudaMalloc'd slots, one H2D and one D2H stream, CUDA events as fences,
//                 ordered against the compute stream the daemon gives (a cudaStream_t as void*).
//                 Only with THETAD_WITH_CUDA (make_cuda_device).
//
//   Fence done = dev.h2d(slot, host, bytes, dev.record_compute());  // copy after compute so far
//   dev.compute_wait(done);                                         // compute reads it later
//   dev.host_wait(dev.d2h(host, grad, bytes, dev.record_compute())); // host sees the gradient
//
// No call synchronizes the whole device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace thetad::offload {

// A point on one of the device's streams. Empty = already complete. Copyable; the event behind
// it is released when the last copy goes away.
struct Fence {
  std::shared_ptr<void> event;
  bool empty() const { return !event; }
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;
  virtual bool is_host() const = 0;

  // Device memory for one slot; release with free(). Throws ConfigError when it cannot be had.
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* ptr) noexcept = 0;

  // Page-locks host memory for fast async copies (no-op on HostDevice). Called at startup only.
  virtual void pin_host(void* ptr, size_t bytes) = 0;
  virtual void unpin_host(void* ptr) noexcept = 0;

  // Async copy on the H2D (resp. D2H) stream once `after` has completed; returns its completion.
  virtual Fence h2d(void* dst, const void* src, size_t bytes, const Fence& after) = 0;
  virtual Fence d2h(void* dst, const void* src, size_t bytes, const Fence& after) = 0;
  // dst[i] = float(src[i]) for n bfloat16 values in device memory (what an h2d copy brought into
  // a staging buffer), on the H2D stream once `after` has completed; returns its completion.
  // Parameters cross PCIe at half the bytes and are widened on the device (offload.h2d_dtype).
  virtual Fence widen_bf16(float* dst, const uint16_t* src, size_t n, const Fence& after) = 0;

  // Async copy from device memory (this device's, or another rank's opened with open_shared) to
  // this device's, on the peer-copy stream once `after` has completed; returns its completion.
  // (The gather of a base sharded over the node's devices: homes/streamed_base.hpp.)
  virtual Fence d2d(void* dst, const void* src, size_t bytes, const Fence& after);
  // Device memory from alloc() that other processes of the host may map: share() gives the bytes
  // that name it, open_shared() maps what another process shared (close_shared() unmaps it).
  // CUDA IPC on a GPU; the host device has none (node-shared memory serves there).
  virtual std::string share(void* ptr);
  virtual void* open_shared(const std::string& handle);
  virtual void close_shared(void* ptr) noexcept { (void)ptr; }

  // A fence at the current end of the compute stream.
  virtual Fence record_compute() = 0;
  // The compute stream waits for f (the host does not).
  virtual void compute_wait(const Fence& f) = 0;
  // The host waits for f.
  virtual void host_wait(const Fence& f) = 0;
  // True when f has completed (never blocks).
  virtual bool done(const Fence& f) = 0;
  // The native handle of the D2H copy stream (a cudaStream_t), nullptr where copies are
  // synchronous. Callers whose device buffers a D2H copy reads record their use on it.
  virtual void* d2h_stream() { return nullptr; }
  // The device's free and total memory in bytes; false where it has none of its own (the host).
  // `free` is this rank's share where ranks share the device (make_cuda_device's `sharers`).
  virtual bool memory(size_t* free_bytes, size_t* total_bytes) {
    (void)free_bytes, (void)total_bytes;
    return false;
  }
};

// Device "memory" in ordinary host memory; synchronous copies and empty fences.
class HostDevice final : public Device {
 public:
  std::string name() const override { return "host"; }
  bool is_host() const override { return true; }
  void* alloc(size_t bytes) override;
  void free(void* ptr) noexcept override;
  void pin_host(void*, size_t) override {}
  void unpin_host(void*) noexcept override {}
  Fence h2d(void* dst, const void* src, size_t bytes, const Fence& after) override;
  Fence d2h(void* dst, const void* src, size_t bytes, const Fence& after) override;
  Fence widen_bf16(float* dst, const uint16_t* src, size_t n, const Fence& after) override;
  Fence d2d(void* dst, const void* src, size_t bytes, const Fence& after) override;
  Fence record_compute() override { return {}; }
  void compute_wait(const Fence&) override {}
  void host_wait(const Fence&) override {}
  bool done(const Fence&) override { return true; }
};

// What an "auto" device cache may take (offload.device_cache_mb, offload.shared_device_layers):
// the device's free memory now less a margin for what is allocated later (activations, gradient
// pools) and the allocator's fragmentation, the larger of 2 GiB and a fifth of the device; 0
// where the device has no memory of its own (the host). `after_a_step`: the allocator already
// holds a whole step's activations and pools, so the margin covers only their variation from
// step to step and fragmentation: the larger of 2 GiB and a tenth of the device.
size_t auto_cache_bytes(Device& device, bool after_a_step = false);

// True when this build has CUDA and a GPU is visible.
bool cuda_available();

// A CudaDevice on GPU `device`, ordered against `compute_stream` (a cudaStream_t; nullptr = the
// legacy default stream), shared with `sharers` - 1 other ranks of the host (its free memory
// divided among them: comm::ranks_sharing_device). Throws ConfigError when the build has no CUDA
// or no GPU is present.
std::unique_ptr<Device> make_cuda_device(int device, void* compute_stream, int sharers = 1);

}  // namespace thetad::offload
