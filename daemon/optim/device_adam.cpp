// The one device AdamW (see device_adam.hpp).
#include "daemon/optim/device_adam.hpp"

#if THETAD_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <torch/torch.h>

#include "common/errors.hpp"

namespace thetad::daemon {

struct DeviceAdam::SideStream {
#if THETAD_TORCH_CUDA
  explicit SideStream(c10::DeviceIndex dev) : stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, dev)) {}
  c10::cuda::CUDAStream stream;
#endif
};

DeviceAdam::DeviceAdam(const DataPlane& plane, const config::OptimizerConfig& opt)
    : plane_(plane), overlap_(overlaps(plane, opt)) {
#if THETAD_TORCH_CUDA
  if (overlap_) side_ = std::make_unique<SideStream>(plane_.device.index());
#endif
}

DeviceAdam::~DeviceAdam() = default;

bool DeviceAdam::overlaps(const DataPlane& plane, const config::OptimizerConfig& opt) {
#if THETAD_TORCH_CUDA
  return plane.gpu() && opt.overlap && opt.clip_norm <= 0;
#else
  (void)plane;
  (void)opt;
  return false;
#endif
}

void DeviceAdam::step(AdamOperands& ops, AdamSettings s, double clip_norm) const {
  if (ops.params.empty()) return;
  plane_.on_compute_stream([&] {
    torch::NoGradGuard no_grad;
    s.grad_scale = clip_scale(ops.grads, clip_norm);
    adam_group(ops.params, ops.grads, ops.exp_avg, ops.exp_avg_sq, s);
  });
}

// The operands are done with for this backward: their gradients were final when the bucket
// launched, after every kernel that reads them was queued on the compute stream, and the
// allreduce waited for those. The arithmetic is the group's (elementwise, same step count and
// settings), so the values come out bit for bit those of a whole-group step.
void DeviceAdam::step_after(comm::Work& work, const AdamSettings& s,
                            const std::function<void(AdamOperands&)>& gather) {
  THETAD_CHECK(overlap_, InternalError, "optimizer: a side-stream step without optimizer.overlap");
#if THETAD_TORCH_CUDA
  work.block_stream(side_->stream.stream(), plane_.comm->default_timeout());
  c10::cuda::CUDAStreamGuard on_side(side_->stream);
  torch::NoGradGuard no_grad;  // thread-local: this may run on autograd's device thread
  AdamOperands ops;
  gather(ops);
  if (!ops.params.empty()) adam_group(ops.params, ops.grads, ops.exp_avg, ops.exp_avg_sq, s);
#else
  (void)work;
  (void)gather;
  (void)s;
#endif
}

void DeviceAdam::join() {
#if THETAD_TORCH_CUDA
  if (!overlap_) return;
  at::cuda::CUDAEvent done;
  done.record(side_->stream);
  done.block(c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(plane_.compute_stream), plane_.device.index()));
#endif
}

}  // namespace thetad::daemon
