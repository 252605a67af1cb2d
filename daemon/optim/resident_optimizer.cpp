// The device-resident groups' optimizer (see resident_optimizer.hpp).
#include "daemon/optim/resident_optimizer.hpp"

#if THETAD_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "common/errors.hpp"

namespace thetad::daemon {

struct ResidentOptimizer::SideStream {
#if THETAD_TORCH_CUDA
  explicit SideStream(c10::DeviceIndex dev) : stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, dev)) {}
  c10::cuda::CUDAStream stream;
#endif
};

ResidentOptimizer::ResidentOptimizer(ParamGroups& groups, const GradHooks& hooks, const comm::BucketPlan& plan,
                                     const DataPlane& plane, std::vector<uint8_t> resident,
                                     const config::OptimizerConfig& opt)
    : groups_(groups), hooks_(hooks), plan_(plan), plane_(plane), resident_(std::move(resident)),
      clip_norm_(opt.clip_norm), overlap_(overlaps(plane, opt)) {
#if THETAD_TORCH_CUDA
  if (overlap_) side_ = std::make_unique<SideStream>(plane_.device.index());
#endif
  exp_avg_.resize(groups_.size());
  exp_avg_sq_.resize(groups_.size());
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(plane_.device);
  for (size_t i = 0; i < groups_.size(); ++i) {
    const auto& p = groups_[static_cast<int>(i)];
    if (!resident_[static_cast<size_t>(p.group)]) continue;  // its moments live in the host store
    exp_avg_[i] = torch::zeros(p.tensor.sizes(), opts);
    exp_avg_sq_[i] = torch::zeros(p.tensor.sizes(), opts);
  }
}

ResidentOptimizer::~ResidentOptimizer() = default;

bool ResidentOptimizer::overlaps(const DataPlane& plane, const config::OptimizerConfig& opt) {
#if THETAD_TORCH_CUDA
  return plane.gpu() && opt.overlap && opt.clip_norm <= 0;
#else
  (void)plane;
  (void)opt;
  return false;
#endif
}

void ResidentOptimizer::start_step() { bucket_stepped_.assign(plan_.buckets.size(), 0); }

// Runs `step` (queues its kernels) on the side stream once `work`'s allreduce has landed.
template <typename Step>
void ResidentOptimizer::on_side_after(comm::Work& work, Step&& step) {
#if THETAD_TORCH_CUDA
  work.block_stream(side_->stream.stream(), plane_.comm->default_timeout());
  c10::cuda::CUDAStreamGuard on_side(side_->stream);
  torch::NoGradGuard no_grad;  // thread-local: this may run on autograd's device thread
  step();
#else
  (void)work;
  (void)step;
#endif
}

// Its parameters are done with for this backward: their gradients were final when the bucket
// launched, after every kernel that reads them was queued on the compute stream, and the
// allreduce waited for those. The arithmetic is the group's (elementwise, same step count and
// settings), so the parameters come out bit for bit the same as a whole-group step.
void ResidentOptimizer::step_bucket(int b, int contributors, comm::Work& work, const AdamSettings& s) {
  const comm::Bucket& bucket = plan_.buckets[static_cast<size_t>(b)];
  // Unused groups are not stepped (lazy); unknown counts and other groups: step_group.
  if (!overlap_ || contributors <= 0 || !resident_[static_cast<size_t>(bucket.group)]) return;
  on_side_after(work, [&] { step_params(bucket.params, s); });
  bucket_stepped_[static_cast<size_t>(b)] = 1;
}

void ResidentOptimizer::step_after(comm::Work& work, AdamOperands& ops, const AdamSettings& s) {
  THETAD_CHECK(overlap_, InternalError, "optimizer: a side-stream step without optimizer.overlap");
  on_side_after(work, [&] { adam_group(ops.params, ops.grads, ops.exp_avg, ops.exp_avg_sq, s); });
}

void ResidentOptimizer::join_bucket_steps() {
#if THETAD_TORCH_CUDA
  if (!overlap_) return;
  at::cuda::CUDAEvent done;
  done.record(side_->stream);
  done.block(c10::cuda::getCurrentCUDAStream(plane_.device.index()));
#endif
}

bool ResidentOptimizer::step_group(int g, AdamSettings s) {
  std::vector<int> todo;
  for (int p : groups_.members[static_cast<size_t>(g)])
    if (!bucket_stepped_[static_cast<size_t>(plan_.param_bucket[static_cast<size_t>(p)])]) todo.push_back(p);
  if (todo.empty()) return false;
  step_params(todo, s);
  return true;
}

// The optimizer step of resident parameters, clipped by their joint norm.
void ResidentOptimizer::step_params(const std::vector<int>& params, AdamSettings s) {
  std::vector<torch::Tensor> ps, gs, ms, vs;
  for (int p : params) {
    ps.push_back(groups_[p].tensor);
    gs.push_back(hooks_.view(p));  // also where .grad is not bound yet (a bucket's early step)
    ms.push_back(exp_avg_[static_cast<size_t>(p)]);
    vs.push_back(exp_avg_sq_[static_cast<size_t>(p)]);
  }
  s.grad_scale = clip_scale(gs, clip_norm_);
  adam_group(ps, gs, ms, vs, s);
}

GroupState ResidentOptimizer::state(int g) const {
  GroupState st;
  st.group = g;
  for (int p : groups_.members[static_cast<size_t>(g)]) {
    st.names.push_back(groups_[p].name);
    st.params.push_back(groups_[p].tensor);
    // A group never stepped here (a frozen base) has no moments: zeros in the checkpoint.
    const auto& m = exp_avg_[static_cast<size_t>(p)];
    st.exp_avg.push_back(m.defined() ? m : torch::zeros_like(groups_[p].tensor));
    st.exp_avg_sq.push_back(m.defined() ? exp_avg_sq_[static_cast<size_t>(p)] : torch::zeros_like(groups_[p].tensor));
  }
  return st;
}

void ResidentOptimizer::restore(int g, const GroupState& st) {
  torch::NoGradGuard no_grad;
  const auto& members = groups_.members[static_cast<size_t>(g)];
  for (size_t i = 0; i < members.size(); ++i) {
    const auto p = static_cast<size_t>(members[i]);
    groups_[members[i]].tensor.copy_(st.params[i]);
    if (!exp_avg_[p].defined()) continue;  // never stepped here (a frozen base)
    exp_avg_[p].copy_(st.exp_avg[i]);
    exp_avg_sq_[p].copy_(st.exp_avg_sq[i]);
  }
}

}  // namespace thetad::daemon
