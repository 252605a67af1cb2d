// CudaDevice: slot memory from cudaMalloc, copies on dedicated H2D and D2H streams, CUDA events
// as fences against the daemon's compute stream. Built only with THETAD_WITH_CUDA.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "comm/nccl/scale.hpp"
#include "common/cuda_check.hpp"
#include "common/errors.hpp"
#include "common/cuda_handles.hpp"
#include "offload/device.hpp"

namespace thetad::offload {
namespace {

cudaEvent_t event_of(const Fence& f) { return static_cast<cudaEvent_t>(f.event.get()); }

class CudaDevice final : public Device {
 public:
  CudaDevice(int device, void* compute, int sharers)
      : device_(device), sharers_(std::max(1, sharers)), compute_(static_cast<cudaStream_t>(compute)), h2d_(device),
        d2h_(device) {}

  std::string name() const override { return "cuda:" + std::to_string(device_); }
  bool is_host() const override { return false; }

  void* alloc(size_t bytes) override {
    CUDA_CHECK(cudaSetDevice(device_));
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();  // an allocation failure is not sticky; clear it
      throw ConfigError(detail::concat("cannot allocate a device slot of ", bytes, " bytes on ",
                                       name(), " (", cudaGetErrorString(err),
                                       "); lower offload.device_slots or offload.device_budget_mb, "
                                       "or set offload.shard_mb to shard large groups"));
    }
    return p;
  }
  void free(void* ptr) noexcept override {
    if (ptr) cudaFree(ptr);
  }

  void pin_host(void* ptr, size_t bytes) override {
    CUDA_CHECK(cudaSetDevice(device_));
    const cudaError_t err = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw ConfigError(detail::concat("cannot pin ", bytes, " bytes of host memory (",
                                       cudaGetErrorString(err),
                                       "); the host arena holds every offloaded group: offload fewer "
                                       "groups (offload.enabled) or raise the memlock limit (ulimit -l)"));
    }
  }
  // Also on helper threads (the arena unpins in parallel): a CUDA call on a thread without a
  // current device would create a context on GPU 0 (~0.5 GiB there per process).
  void unpin_host(void* ptr) noexcept override {
    if (!ptr) return;
    cudaSetDevice(device_);
    cudaHostUnregister(ptr);
  }

  Fence h2d(void* dst, const void* src, size_t bytes, const Fence& after) override {
    return copy(h2d_.get(), dst, src, bytes, cudaMemcpyHostToDevice, after);
  }
  Fence d2h(void* dst, const void* src, size_t bytes, const Fence& after) override {
    return copy(d2h_.get(), dst, src, bytes, cudaMemcpyDeviceToHost, after);
  }

  Fence widen_bf16(float* dst, const uint16_t* src, size_t n, const Fence& after) override {
    CUDA_CHECK(cudaSetDevice(device_));
    if (!after.empty()) CUDA_CHECK(cudaStreamWaitEvent(h2d_.get(), event_of(after), 0));
    comm::from_bf16_async(src, dst, n, h2d_.get());
    CUDA_CHECK(cudaGetLastError());
    return record(h2d_.get());
  }

  // Peer reads run on a stream of their own, so that a layer's gather never waits behind the
  // host store's H2D copies (nor they behind it); created at the first.
  Fence d2d(void* dst, const void* src, size_t bytes, const Fence& after) override {
    if (!peer_) peer_ = CudaStream(device_);
    return copy(peer_.get(), dst, src, bytes, cudaMemcpyDefault, after);  // UVA: either GPU's
  }
  std::string share(void* ptr) override {
    CUDA_CHECK(cudaSetDevice(device_));
    cudaIpcMemHandle_t h;
    CUDA_CHECK(cudaIpcGetMemHandle(&h, ptr));
    return std::string(reinterpret_cast<const char*>(&h), sizeof h);
  }
  void* open_shared(const std::string& handle) override {
    THETAD_CHECK(handle.size() == sizeof(cudaIpcMemHandle_t), InternalError, "a CUDA IPC handle of ", handle.size(),
                 " bytes");
    CUDA_CHECK(cudaSetDevice(device_));
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof h);
    void* p = nullptr;
    // Another GPU's memory is read over NVLink (peer access enabled as it is mapped); the same
    // GPU's (ranks sharing one) is mapped as is.
    const cudaError_t err = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw ConfigError(detail::concat("cannot map another rank's device memory on ", name(), " (",
                                       cudaGetErrorString(err),
                                       "): model.base_shard: node needs the node's GPUs to reach each other "
                                       "(CUDA IPC, peer access)"));
    }
    return p;
  }
  void close_shared(void* ptr) noexcept override {
    if (!ptr) return;
    cudaSetDevice(device_);
    cudaIpcCloseMemHandle(ptr);
  }

  Fence record_compute() override { return record(compute_); }
  void compute_wait(const Fence& f) override {
    if (f.empty()) return;
    CUDA_CHECK(cudaStreamWaitEvent(compute_, event_of(f), 0));
  }
  void host_wait(const Fence& f) override {
    if (f.empty()) return;
    CUDA_CHECK(cudaEventSynchronize(event_of(f)));
  }
  void* d2h_stream() override { return d2h_.get(); }
  bool memory(size_t* free_bytes, size_t* total_bytes) override {
    if (cudaSetDevice(device_) != cudaSuccess) return false;
    if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) return false;
    *free_bytes /= static_cast<size_t>(sharers_);  // the others size theirs from the same free memory
    return true;
  }
  bool done(const Fence& f) override {
    if (f.empty()) return true;
    const cudaError_t err = cudaEventQuery(event_of(f));
    if (err == cudaErrorNotReady) return false;
    CUDA_CHECK(err);
    return true;
  }

 private:
  Fence record(cudaStream_t s) {
    // The fence owns the event: destroyed with its last copy (see cuda_handles.hpp).
    auto ev = std::make_shared<CudaEvent>(device_);
    CUDA_CHECK(cudaEventRecord(ev->get(), s));
    return Fence{std::shared_ptr<void>(ev, ev->get())};
  }
  Fence copy(cudaStream_t s, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
             const Fence& after) {
    CUDA_CHECK(cudaSetDevice(device_));
    if (!after.empty()) CUDA_CHECK(cudaStreamWaitEvent(s, event_of(after), 0));
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));
    return record(s);
  }

  int device_;
  int sharers_;  // ranks of the host on this device
  cudaStream_t compute_;
  CudaStream h2d_;
  CudaStream d2h_;
  CudaStream peer_;
};

}  // namespace

bool cuda_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

std::unique_ptr<Device> make_cuda_device(int device, void* compute_stream, int sharers) {
  THETAD_CHECK(cuda_available(), ConfigError, "offload: no CUDA device is visible");
  return std::make_unique<CudaDevice>(device, compute_stream, sharers);
}

}  // namespace thetad::offload
