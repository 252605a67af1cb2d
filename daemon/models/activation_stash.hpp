// offload.activations: the tensors each trunk layer saves for backward leave the device after
// the layer's forward (a D2H copy into pooled pinned host buffers) and come back ahead of the
// layer's backward (an H2D copy started one layer ahead). No recomputation. Works on any
// offload::Device: on the CPU build (HostDevice) the copies are memcpys and the "device" is the
// CPU, so the window and the bits are testable there.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "daemon/observe/timeline.hpp"
#include "daemon/ops/trunk_layer.hpp"
#include "offload/device.hpp"
#include "offload/pinned_pool.hpp"

namespace thetad::daemon {

struct ActivationStats {
  int64_t d2h_bytes = 0;          // saved tensors copied to the host (this step)
  int64_t h2d_bytes = 0;          // and back (this step)
  int64_t device_peak_bytes = 0;  // most bytes of saved tensors the stash held on the device (this step)
  int64_t layer_peak_bytes = 0;   // the largest one layer's saved tensors (this step): the window's unit
  int64_t pool_allocations = 0;   // pinned host allocations so far (constant once warmed up)
  int64_t pool_bytes = 0;         // pinned host bytes of the pool
};

class PooledActivationStash final : public ActivationStash {
 public:
  // `device` copies (its D2H and H2D streams, fences against the compute stream); `window`:
  // how many layers' saved tensors are fetched ahead of the one being differentiated.
  explicit PooledActivationStash(std::unique_ptr<offload::Device> device, int window = 1);
  ~PooledActivationStash() override;

  int64_t put(int layer, std::vector<torch::Tensor> saved) override;
  std::vector<torch::Tensor> take(int64_t ticket) override;

  // After a backward: what it took is no longer held; what it did not take (a graph dropped
  // without backward) is given back to the pool.
  void end_backward();
  // This step's counts (and the pool's); the per-step ones start again from zero.
  ActivationStats step_stats();
  // Queued copies go to the timeline's d2h and h2d lanes (host time of queueing them, as the
  // store's copies do); nullptr: none.
  void set_timeline(Timeline* timeline) { timeline_ = timeline; }

 private:
  struct Saved {
    offload::PinnedBuffer host;
    std::vector<int64_t> sizes;
    torch::ScalarType dtype;
    torch::Device device{torch::kCPU};
    size_t bytes = 0;
  };
  struct Entry {
    int layer = 0;
    std::vector<Saved> saved;
    offload::Fence d2h;                     // the copies to the host
    std::vector<torch::Tensor> on_device;   // held until d2h completes (forward) or from the prefetch on
    offload::Fence h2d;                     // the prefetch's copies back
    bool fetched = false;
    int64_t bytes = 0;
  };

  void hold(Entry& e, std::vector<torch::Tensor> tensors);
  void drop(Entry& e);
  void fetch(Entry& e);
  void reap_forward(bool force_all_but_last);
  void retire(Entry&& e);
  void reap_returning();
  offload::PinnedBuffer host_buffer(size_t bytes);

  std::unique_ptr<offload::Device> device_;
  offload::PinnedPool pool_;
  const int window_;
  std::mutex mu_;  // autograd may run backward on its device thread
  std::map<int64_t, Entry> entries_;
  std::vector<int64_t> forward_pending_;  // tickets whose D2H copies may still read device memory
  std::vector<std::pair<offload::Fence, offload::PinnedBuffer>> returning_;  // host buffers an H2D still reads
  std::vector<int64_t> taken_;            // tickets handed to a backward that may still use them
  int64_t next_ticket_ = 0;
  int64_t held_bytes_ = 0;
  Timeline* timeline_ = nullptr;
  ActivationStats stats_;
};

// The stash of a job with offload.activations on a device: copies on the device's own streams
// (a CudaDevice ordered against `compute_stream` on GPUs, the host device on the CPU).
std::unique_ptr<PooledActivationStash> make_activation_stash(const torch::Device& device, void* compute_stream);

}  // namespace thetad::daemon
