// Picking the device and the gradients' communicator (see data_plane.hpp).
#include "daemon/device/data_plane.hpp"

#if THETAD_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <optional>
#include <string>

#include "comm/node_split.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "daemon/plan/job_options.hpp"

namespace thetad::daemon {

void DataPlane::on_compute_stream(const std::function<void()>& fn) const {
#if THETAD_TORCH_CUDA
  std::optional<c10::cuda::CUDAStreamGuard> on_compute;
  if (gpu())
    on_compute.emplace(c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(compute_stream), device.index()));
#endif
  fn();
}

int64_t DataPlane::allocator_peak_bytes() const {
#if THETAD_TORCH_CUDA
  if (gpu()) return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].peak;
#endif
  return 0;
}

int64_t DataPlane::allocator_current_bytes() const {
#if THETAD_TORCH_CUDA
  if (gpu()) return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].current;
#endif
  return 0;
}

void DataPlane::reset_allocator_peak() const {
#if THETAD_TORCH_CUDA
  if (gpu()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
}

const char* to_string(DataPlaneKind kind) {
  switch (kind) {
    case DataPlaneKind::mpi: return "mpi";
    case DataPlaneKind::nccl: return "nccl";
    case DataPlaneKind::nccl_without_gpu: return "nccl, but no GPU is visible";
  }
  return "?";
}

DataPlane open_data_plane(const config::Job& job, const comm::WorldInfo& world, comm::ControlPlane& plane,
                          std::shared_ptr<comm::Communicator> ctrl) {
  DataPlane dp;
#if THETAD_TORCH_CUDA
  if (job.comm.backend == config::Backend::Nccl || (job.comm.backend == config::Backend::Auto && torch::cuda::is_available()))
    dp.kind = torch::cuda::device_count() > 0 ? DataPlaneKind::nccl : DataPlaneKind::nccl_without_gpu;
#endif
  plane.check_consistent("data plane (comm.backend: " + config::to_string(job.comm.backend) + ")",
                         std::string("data plane: ") + to_string(dp.kind) + "\n");
  if (dp.kind == DataPlaneKind::nccl_without_gpu) throw ConfigError(job.source + ": comm.backend: " + to_string(dp.kind));
#if THETAD_TORCH_CUDA
  if (dp.kind == DataPlaneKind::nccl) {
    const int count = static_cast<int>(torch::cuda::device_count());
    const auto dev = static_cast<c10::DeviceIndex>(world.local_rank % count);
    dp.device = torch::Device(torch::kCUDA, dev);
    c10::cuda::set_device(dev);
    // Compute runs on a stream of its own, not the legacy default stream: on that one,
    // cudaStreamWaitEvent (the engine's wait for the last buckets) blocked the host until the
    // event completed, ~6 ms per step on 2×H200, so the host could not queue the next step.
    c10::cuda::setCurrentCUDAStream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, dev));
    dp.compute_stream = c10::cuda::getCurrentCUDAStream(dev).stream();
    const cudaDeviceProp* props = at::cuda::getDeviceProperties(dev);
    if (job.precision == config::Precision::Bf16 && props->major < 8)
      throw ConfigError(job.source + ": precision: bf16 needs a GPU with bfloat16 tensor cores (compute capability "
                        "8.0 or newer); GPU " + std::to_string(dev) + " (" + props->name + ") is " +
                        std::to_string(props->major) + "." + std::to_string(props->minor) + " (use fp32 or tf32)");
    at::globalContext().setAllowTF32CuBLAS(job.precision == config::Precision::Tf32);
    at::globalContext().setAllowTF32CuDNN(job.precision == config::Precision::Tf32);
    // Simulated nodes (or ranks) outnumbering the GPUs share one: what a rank sizes from its free
    // memory (device_cache_mb and shared_device_layers auto) is then its share.
    char bus_id[32] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, dev) != cudaSuccess) (void)cudaGetLastError();
    dp.device_sharers = comm::ranks_sharing_device(bus_id);
    if (dp.device_sharers > 1)
      THETAD_LOG(info, "comm") << "GPU " << bus_id << " is shared by " << dp.device_sharers
                               << " ranks of this host: sizes taken from its free memory (auto) are this rank's share";
    dp.comm = comm::make_nccl_communicator(dev, plane);  // the id exchange bounded by comm.timeout_s
    dp.comm->set_compute_stream(dp.compute_stream);
  }
#else
  (void)world;
#endif
  if (!dp.comm) dp.comm = std::move(ctrl);
  dp.comm->set_default_timeout(comm_timeout(job));
  THETAD_LOG(info, "comm") << "data plane " << dp.comm->backend_name() << ", device " << dp.device.str();
  return dp;
}

}  // namespace thetad::daemon
