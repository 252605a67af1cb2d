// The group -> home table (see homes.hpp).
#include "daemon/homes/homes.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "daemon/homes/resident_home.hpp"
#include "daemon/homes/store_home.hpp"
#include "daemon/homes/streamed_base.hpp"
#include "daemon/homes/streamed_trunk.hpp"
#include "daemon/ops/precision.hpp"

namespace thetad::daemon {

Homes::Homes(const config::Job& job, const Placement& placement, TaskModel& model, ParamGroups& groups,
             const DataPlane& plane, Timeline* timeline)
    : job_(job), placement_(placement), groups_(groups), plane_(plane), timeline_(timeline),
      adam_(plane, job.optimizer) {
  // One home per kind the placement names, made in set-up order: the resident home (every group's
  // until placed elsewhere, and a test's default), the θ[t] store, then Θ's streamed store, which
  // shares the θ[t] store's copy device.
  auto resident =
      std::make_unique<ResidentHome>(job, model, groups, plane, adam_, timeline, placement.replica_keepable);
  GroupHome* const on_device = resident.get();
  home_of_.assign(static_cast<size_t>(groups.num_groups()), on_device);
  homes_.push_back(std::move(resident));
  for (HomeKind kind : {HomeKind::host_store, HomeKind::streamed_trunk}) {
    std::unique_ptr<GroupHome> home;
    for (int g = 0; g < groups.num_groups(); ++g) {
      if (placement.home(g) != kind) continue;
      if (!home && kind == HomeKind::host_store)
        home = std::make_unique<StoreHome>(job, model, groups, plane, adam_, timeline, placement.unheld_tasks);
      if (!home && kind == HomeKind::streamed_trunk)
        home = std::make_unique<StreamedTrunk>(job, model, groups, plane, adam_, timeline);
      home_of_[static_cast<size_t>(g)] = home.get();
    }
    if (home) homes_.push_back(std::move(home));
  }
  group_steps_.assign(static_cast<size_t>(groups.num_groups()), 0);
  find_in_use();
  // The frozen base's layers into host memory, their parameters host_only from here on.
  if (placement.streamed_base) streamed_base_ = std::make_unique<StreamedBase>(job, placement, model, plane);
  // A model with groups in a host store was built on the host; the resident ones move to the
  // device (the stores take the others from the host).
  if (plane.device.is_cpu() || !placement.model_on_host) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < groups.size(); ++i) {
    auto& np = groups[static_cast<int>(i)];
    if (&of(np.group) == on_device && !np.host_only) np.tensor.set_data(np.tensor.detach().to(plane.device));
  }
}

// Homes are destroyed in the reverse order of their set-up: Θ's streamed store runs on the θ[t]
// store's device (its streams), so it must go first.
Homes::~Homes() {
  while (!homes_.empty()) homes_.pop_back();
  streamed_base_.reset();
}

torch::Device Homes::model_device(const Placement& placement, const DataPlane& plane) {
  return placement.model_on_host ? torch::Device(torch::kCPU) : plane.device;
}

void Homes::place(int g, std::unique_ptr<GroupHome> home) {
  THETAD_CHECK(engine_ == nullptr, InternalError, "Homes::place after set-up");
  home_of_.at(static_cast<size_t>(g)) = home.get();
  homes_.push_back(std::move(home));
  find_in_use();
}

void Homes::find_in_use() {
  in_use_.clear();
  for (const auto& h : homes_) {
    std::vector<int> held;
    for (int g = 0; g < num_groups(); ++g)
      if (home_of_[static_cast<size_t>(g)] == h.get()) held.push_back(g);
    if (!held.empty()) in_use_.push_back(h.get());
    h->hold(std::move(held));
  }
}

std::vector<comm::GradMemory> Homes::grad_memory() const {
  std::vector<comm::GradMemory> modes;
  for (int g = 0; g < num_groups(); ++g) modes.push_back(of(g).grad_memory(g));
  return modes;
}

// A group that never has a gradient (GradMemory::none: a frozen base) is planned with no
// elements: no bucket, no gradient memory, no launch and no bytes, even with prune off.
std::vector<comm::ParamInfo> Homes::plan_params() const {
  const std::vector<comm::GradMemory> modes = grad_memory();
  std::vector<comm::ParamInfo> infos;
  for (size_t i = 0; i < groups_.size(); ++i) {
    const NamedParam& p = groups_[static_cast<int>(i)];
    const bool none = modes[static_cast<size_t>(p.group)] == comm::GradMemory::none;
    infos.push_back({p.name, none ? size_t{0} : static_cast<size_t>(p.tensor.numel()), p.group});
  }
  for (GroupHome* h : in_use_) h->plan_params(infos);
  return infos;
}

void Homes::engine_options(comm::EngineOptions& o) {
  o.grad_memory = grad_memory();
  for (GroupHome* h : in_use_) h->engine_options(o);
}

// The engine paces streamed buckets where the host waits (one per call): what became ready
// behind one is pulled once it is consumed.
void Homes::take(const comm::Launches& launches) {
  if (launches.empty()) return;
  std::lock_guard<std::mutex> lock(take_mu_);
  const auto t0 = std::chrono::steady_clock::now();
  for (comm::Launches more = launches; !more.empty(); more = engine_->launch_ready())
    for (const comm::Launched& l : more) {
      if (timeline_) timeline_->record(Lane::comm, "launch bucket " + std::to_string(l.bucket), Timeline::now_us(), 0);
      of(engine_->plan().buckets[static_cast<size_t>(l.bucket)].group).on_bucket_launch(l);
    }
  take_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double Homes::take_ms() const {
  std::lock_guard<std::mutex> lock(take_mu_);
  return take_ms_;
}

// The homes are built in set-up order: a store built later (Θ's) shares the copy device of one
// built before (θ[t]'s: HomeSetup::copy_device), so that both use the same H2D and D2H streams.
void Homes::build(comm::Engine& engine, WindowPlans& plans, int rank) {
  engine_ = &engine;
  HomeSetup setup{engine, plans, rank, launch_handler()};
  for (GroupHome* h : in_use_) h->build(setup);
}

void Homes::start_window(const WindowPlan& plan, const AdamSettings& settings) {
  {
    std::lock_guard<std::mutex> lock(take_mu_);
    take_ms_ = 0;
  }
  window_.adam = settings;
  window_.group_steps = &group_steps_;
  window_.update_known = job_.train.on_nonfinite != config::NonFinite::SkipStep && job_.optimizer.clip_norm <= 0;
  for (GroupHome* h : in_use_) h->start_window(plan, window_);
}

void Homes::start_micro(const StepPlan& plan) {
  for (GroupHome* h : in_use_) h->start_micro(plan);
}

void Homes::add_reached(std::vector<uint8_t>& found) const {
  for (GroupHome* h : in_use_) h->add_reached(found);
}

void Homes::before_backward(bool last, const StepPlan& plan) {
  for (GroupHome* h : in_use_) h->before_backward(last, plan);
}

void Homes::after_backward(bool last) {
  for (GroupHome* h : in_use_) h->after_backward(last);
}

void Homes::after_reduce() {
  for (GroupHome* h : in_use_) h->after_reduce();
}

// Lazy: a group no rank used this step is not stepped at all (its step count stays). A group
// one rank kept (the replica rule) counts the step on every rank, and its home steps it there only.
void Homes::step(const std::vector<int>& contributors, const AdamSettings& settings, bool skip) {
  torch::NoGradGuard no_grad;
  adam_.join();  // the buckets stepped as they landed come first
  for (int g = 0; g < num_groups(); ++g) {
    const auto gi = static_cast<size_t>(g);
    if (contributors[gi] == 0 || skip) {
      of(g).skip(g);
      continue;
    }
    AdamSettings s = settings;
    s.step = ++group_steps_[gi];
    of(g).step(g, s);
  }
}

Homes::HostValues Homes::values_on_host(int p) const {
  const NamedParam& np = groups_[p];
  HostValues v;
  if ((v.data = of(np.group).host_values(p))) return v;
  if (np.host_only && np.init) {  // a drawn base's matrix, held quantized only: drawn again
    v.keep = np.drawn();
    v.data = v.keep.data_ptr<float>();
    return v;
  }
  v.keep = fp32_values(np.tensor.detach()).cpu().contiguous();
  v.data = v.keep.data_ptr<float>();
  return v;
}

bool Homes::finite(int p) const {
  const NamedParam& np = groups_[p];
  if (const float* v = of(np.group).host_values(p)) {
    for (int64_t i = 0, n = np.tensor.numel(); i < n; ++i)
      if (!std::isfinite(v[i])) return false;
    return true;
  }
  return torch::isfinite(np.tensor.detach()).all().item<bool>();
}

void Homes::release_step(int64_t step) {
  for (GroupHome* h : in_use_) h->release_step(step);
}

void Homes::make_current() {
  for (GroupHome* h : in_use_) h->make_current();
}

HomeMemory Homes::device_memory() const {
  HomeMemory sum;
  for (GroupHome* h : in_use_) {
    const HomeMemory m = h->device_memory();
    sum.params += m.params;
    sum.optimizer += m.optimizer;
    sum.lines += m.lines;
  }
  return sum;
}

void Homes::add_stats(StepRecord& rec) {
  for (GroupHome* h : in_use_) h->add_stats(rec);
}

}  // namespace thetad::daemon
