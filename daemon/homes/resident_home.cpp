// The device-resident groups (see resident_home.hpp).
#include "daemon/homes/resident_home.hpp"

#include <string>

#include "common/errors.hpp"
#include "daemon/ops/precision.hpp"

namespace thetad::daemon {

ResidentHome::ResidentHome(const config::Job& job, const TaskModel& model, ParamGroups& groups,
                           const DataPlane& plane, DeviceAdam& adam, Timeline* timeline, std::vector<uint8_t> keepable)
    : job_(job), model_(model), groups_(groups), plane_(plane), adam_(adam), timeline_(timeline),
      keepable_(std::move(keepable)) {
  exp_avg_.resize(groups_.size());
  exp_avg_sq_.resize(groups_.size());
}

// A frozen base (model.train_shared: false) never has a gradient: no bucket, no .grad view, no
// moments. Row-chunked groups add rows into their .grad: buckets of their own (owned). Θ takes
// its first gradient of a window by copy (overwrite: no memset per step). θ[t] take theirs in
// buffers of a pool bound per window to the groups in use (pooled): gradient memory follows the
// groups one step uses, not T, as a plain loop's does with grads set to None. In a world of one
// rank (float32 on the wire) nothing is reduced, so Θ and θ[t] keep autograd's own gradients
// (adopted): no bucket, no pool, no copy or zeroing pass, and no gradient memory during forward.
comm::GradMemory ResidentHome::grad_memory(int g) const {
  if (g == 0 && !job_.model.train_shared) return comm::GradMemory::none;
  if (model_.row_chunked(g)) return comm::GradMemory::owned;
  if (plane_.comm->size() == 1 && job_.comm.grad_dtype != config::GradDtype::Bf16) return comm::GradMemory::adopted;
  return g == 0 ? comm::GradMemory::overwrite : comm::GradMemory::pooled;
}

void ResidentHome::build(HomeSetup& setup) {
  comm::Engine& engine = setup.engine;
  engine_ = &engine;
  bucket_stepped_.assign(engine.plan().buckets.size(), 0);
  // The replica rule: for the groups held here that have a gradient of the engine's own.
  std::vector<uint8_t> keepable = keepable_, held_here(keepable.size(), 0);
  for (int g : held()) held_here[static_cast<size_t>(g)] = 1;
  bool any = false;
  for (size_t g = 0; g < keepable.size(); ++g) {
    const comm::GradMemory m = held_here[g] ? grad_memory(static_cast<int>(g)) : comm::GradMemory::none;
    keepable[g] = keepable[g] && (m == comm::GradMemory::owned || m == comm::GradMemory::overwrite ||
                                  m == comm::GradMemory::pooled);
    any = any || keepable[g];
  }
  if (!any) return;
  std::vector<int64_t> state_numel;  // replica_state's elements: values, and Adam's two moments
  const int64_t tensors = job_.optimizer.kind == config::OptimizerKind::Sgd ? 1 : 3;
  for (size_t g = 0; g < keepable.size(); ++g) state_numel.push_back(tensors * groups_.numel(static_cast<int>(g)));
  replicas_ = std::make_unique<ResidentReplicas>(job_, plane_, engine, setup.plans, std::move(keepable),
                                                 std::move(state_numel), [this](int g) { return replica_state(g); },
                                                 timeline_);
}

// Values, then Adam's moments (created as zeros where this rank never updated the group: the
// moments it would hold), in the group's parameter order.
std::vector<torch::Tensor> ResidentHome::replica_state(int g) {
  std::vector<torch::Tensor> parts;
  const auto& members = groups_.members[static_cast<size_t>(g)];
  for (int p : members) parts.push_back(groups_[p].tensor.detach());
  if (job_.optimizer.kind == config::OptimizerKind::Sgd) return parts;
  for (int p : members) {
    if (!exp_avg_[static_cast<size_t>(p)].defined()) create_moments(p);
    parts.push_back(exp_avg_[static_cast<size_t>(p)]);
  }
  for (int p : members) parts.push_back(exp_avg_sq_[static_cast<size_t>(p)]);
  return parts;
}

void ResidentHome::make_current() {
  if (replicas_) replicas_->make_current();
}

void ResidentHome::add_stats(StepRecord& rec) {
  if (replicas_) replicas_->add_stats(rec);
}

// The pooled groups this rank uses in the window get their .grad in the pool buffer bound to
// them now (zeroed: autograd's first gradient adds into it, 0 + g = g).
void ResidentHome::start_window(const WindowPlan& plan, const WindowSettings& w) {
  window_ = &w;
  std::fill(bucket_stepped_.begin(), bucket_stepped_.end(), 0);
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(plane_.device);
  for (int g : held()) {
    if (g == 0 || !plan.reads(g) || grad_memory(g) != comm::GradMemory::pooled) continue;
    for (int p : groups_.members[static_cast<size_t>(g)])
      groups_[p].tensor.mutable_grad() = torch::from_blob(engine_->grad(p), groups_[p].tensor.sizes(), opts);
  }
  if (replicas_) replicas_->start_window(plan.window);  // before forward reads any replica
}

void ResidentHome::create_moments(int p) {
  const auto i = static_cast<size_t>(p);
  const torch::Tensor& t = groups_[p].tensor;
  exp_avg_[i] = torch::zeros_like(t, torch::MemoryFormat::Contiguous);
  exp_avg_sq_[i] = torch::zeros_like(t, torch::MemoryFormat::Contiguous);
  moment_bytes_ += 2 * t.numel() * static_cast<int64_t>(t.element_size());
}

HomeMemory ResidentHome::device_memory() const {
  HomeMemory m;
  if (plane_.device.is_cpu()) return m;
  for (int g : held())
    for (int p : groups_.members[static_cast<size_t>(g)]) {
      const torch::Tensor& t = groups_[p].tensor;
      m.params += t.numel() * static_cast<int64_t>(t.element_size());
    }
  m.optimizer = moment_bytes_;
  return m;
}

// Parameter p's operands: its values, its gradient at `grad`, its moments (zeros at its first
// update: the same bits as moments held from the start).
void ResidentHome::add_operands(int p, float* grad, AdamOperands& ops) {
  const auto i = static_cast<size_t>(p);
  const NamedParam& np = groups_[p];
  if (!exp_avg_[i].defined()) create_moments(p);
  ops.params.push_back(np.tensor);
  ops.grads.push_back(torch::from_blob(grad, np.tensor.sizes(),
                                       torch::TensorOptions().dtype(torch::kFloat32).device(plane_.device)));
  ops.exp_avg.push_back(exp_avg_[i]);
  ops.exp_avg_sq.push_back(exp_avg_sq_[i]);
}

// optimizer.overlap: the bucket's parameters are stepped on the side stream once its allreduce
// lands, where nothing after backward can change the update and some rank used the group
// (unknown counts, -1: the whole group after backward).
void ResidentHome::on_bucket_launch(const comm::Launched& l) {
  if (!adam_.overlap() || !window_->update_known || l.contributors <= 0) return;
  const comm::Bucket& bucket = engine_->plan().buckets[static_cast<size_t>(l.bucket)];
  if (replicas_ && replicas_->stale_here(bucket.group)) return;  // made current first, in step
  adam_.step_after(*l.work, window_->for_group(bucket.group), [&](AdamOperands& ops) {
    for (size_t k = 0; k < bucket.params.size(); ++k) {  // on the side stream: first moments too
      const int p = bucket.params[k];
      add_operands(p, l.data ? l.data + bucket.offsets[k] : engine_->adopted_grad(p), ops);
    }
  });
  bucket_stepped_[static_cast<size_t>(l.bucket)] = 1;
}

void ResidentHome::step(int g, const AdamSettings& s) {
  if (grad_memory(g) == comm::GradMemory::none) return;  // never a gradient: never updated
  // Another rank kept the gradient: it alone steps the group; this replica goes stale.
  if (replicas_ && replicas_->applies(g) && !replicas_->before_update(g)) return;
  const int64_t t_us = Timeline::now_us();
  AdamOperands ops;
  const auto& param_bucket = engine_->plan().param_bucket;
  for (int p : groups_.members[static_cast<size_t>(g)])
    if (!bucket_stepped_[static_cast<size_t>(param_bucket[static_cast<size_t>(p)])]) add_operands(p, engine_->grad(p), ops);
  if (ops.params.empty()) return;
  adam_.step(ops, s, job_.optimizer.clip_norm);
  if (timeline_)
    timeline_->record(Lane::compute, g == 0 ? "adam Θ" : "adam θ[" + std::to_string(g - 1) + "]", t_us,
                      Timeline::now_us() - t_us);
}

GroupState ResidentHome::state(int g) {
  GroupState st;
  st.group = g;
  for (int p : groups_.members[static_cast<size_t>(g)]) {
    const auto i = static_cast<size_t>(p);
    st.names.push_back(groups_[p].name);
    st.params.push_back(fp32_values(groups_[p].tensor));  // a bf16-held frozen base: widened on the host
    // A group never updated (a frozen base, a task not trained yet) has no moments: zeros.
    const bool has = exp_avg_[i].defined();
    st.exp_avg.push_back(has ? exp_avg_[i] : torch::zeros_like(st.params.back()));
    st.exp_avg_sq.push_back(has ? exp_avg_sq_[i] : torch::zeros_like(st.params.back()));
  }
  return st;
}

void ResidentHome::restore(int g, const GroupState& st) {
  torch::NoGradGuard no_grad;
  const auto& members = groups_.members[static_cast<size_t>(g)];
  for (size_t k = 0; k < members.size(); ++k) {
    const auto i = static_cast<size_t>(members[k]);
    groups_[members[k]].tensor.copy_(st.params[k]);
    if (st.steps == 0 && !exp_avg_[i].defined()) continue;  // never updated: no moments yet
    if (!exp_avg_[i].defined()) create_moments(members[k]);
    exp_avg_[i].copy_(st.exp_avg[k]);
    exp_avg_sq_[i].copy_(st.exp_avg_sq[k]);
  }
}

}  // namespace thetad::daemon
