// The data plane of a rank: where its tensors live (a GPU picked by the local rank, or the
// CPU), the communicator its gradients travel on (NCCL on GPUs, else the control plane's MPI),
// and, on GPUs, the stream its compute runs on. Every rank agrees on it before any rank starts
// one (NCCL set-up is collective).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>

#include "comm/bootstrap.hpp"
#include "comm/control_plane.hpp"
#include "config/job.hpp"

namespace thetad::daemon {

// The gradients' communicator: the control plane's MPI (CPUs), or NCCL (GPUs; asked for on a
// machine whose ranks see none: nccl_without_gpu, a ConfigError once every rank agrees on it).
enum class DataPlaneKind { mpi, nccl, nccl_without_gpu };
// "mpi", "nccl", "nccl, but no GPU is visible": what the ranks compare and messages show.
const char* to_string(DataPlaneKind kind);

struct DataPlane {
  DataPlaneKind kind = DataPlaneKind::mpi;
  torch::Device device{torch::kCPU};
  std::shared_ptr<comm::Communicator> comm;  // gradients
  void* compute_stream = nullptr;            // cudaStream_t of the compute work (GPUs)
  int device_sharers = 1;                    // ranks of this host on this GPU (comm::ranks_sharing_device)

  bool gpu() const { return device.is_cuda(); }
  // Runs `fn` with the compute stream current (GPUs; elsewhere just runs it): work that the
  // engine's collectives must be ordered after (they wait for the compute stream).
  void on_compute_stream(const std::function<void()>& fn) const;
  // Most bytes the caching allocator held at once on the device (0 on the CPU).
  int64_t allocator_peak_bytes() const;
  // Bytes the caching allocator holds allocated now (0 on the CPU).
  int64_t allocator_current_bytes() const;
  // Starts a new peak at what is allocated now (the per-step memory breakdown).
  void reset_allocator_peak() const;
};

// `comm.backend: auto` means NCCL when a GPU is visible, MPI otherwise; `ctrl` is the job's
// control-plane communicator, also the data plane on the CPU.
DataPlane open_data_plane(const config::Job& job, const comm::WorldInfo& world, comm::ControlPlane& plane,
                          std::shared_ptr<comm::Communicator> ctrl);

}  // namespace thetad::daemon
