// CudaDevice: slot memory from cudaMalloc, copies on dedicated H2D and D2H streams, CUDA events
// as fences against the daemon's compute stream. Built only with THETAD_WITH_CUDA.
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "common/cuda_check.hpp"
#include "common/errors.hpp"
#include "offload/device.hpp"

namespace thetad::offload {
namespace {

// Move-only owner of a cudaStream_t.
class Stream {
 public:
  explicit Stream(int device) {
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
  }
  ~Stream() {
    if (s_) cudaStreamDestroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

cudaEvent_t event_of(const Fence& f) { return static_cast<cudaEvent_t>(f.event.get()); }

class CudaDevice final : public Device {
 public:
  CudaDevice(int device, void* compute)
      : device_(device), compute_(static_cast<cudaStream_t>(compute)), h2d_(device), d2h_(device) {}

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
  bool done(const Fence& f) override {
    if (f.empty()) return true;
    const cudaError_t err = cudaEventQuery(event_of(f));
    if (err == cudaErrorNotReady) return false;
    CUDA_CHECK(err);
    return true;
  }

 private:
  Fence record(cudaStream_t s) {
    CUDA_CHECK(cudaSetDevice(device_));
    cudaEvent_t ev = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    // The fence owns the event: destroyed with its last copy (destroying a pending event is
    // allowed; CUDA releases it once it completes).
    // The last copy may go on another thread (the store's optimizer worker): on this device.
    Fence f{std::shared_ptr<void>(ev, [dev = device_](void* e) {
      cudaSetDevice(dev);
      cudaEventDestroy(static_cast<cudaEvent_t>(e));
    })};
    CUDA_CHECK(cudaEventRecord(ev, s));
    return f;
  }
  Fence copy(cudaStream_t s, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
             const Fence& after) {
    CUDA_CHECK(cudaSetDevice(device_));
    if (!after.empty()) CUDA_CHECK(cudaStreamWaitEvent(s, event_of(after), 0));
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));
    return record(s);
  }

  int device_;
  cudaStream_t compute_;
  Stream h2d_;
  Stream d2h_;
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

std::unique_ptr<Device> make_cuda_device(int device, void* compute_stream) {
  THETAD_CHECK(cuda_available(), ConfigError, "offload: no CUDA device is visible");
  return std::make_unique<CudaDevice>(device, compute_stream);
}

}  // namespace thetad::offload
