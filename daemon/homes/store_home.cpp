// θ[t] in the host store (see store_home.hpp).
#include "daemon/homes/store_home.hpp"

#if THETAD_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <iomanip>
#include <string>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/stopwatch.hpp"
#include "daemon/plan/job_options.hpp"
#include "daemon/homes/line_views.hpp"
#include "daemon/homes/store_chunks.hpp"

namespace thetad::daemon {
struct StoreHome::InFlight {
#if THETAD_TORCH_CUDA
  std::deque<std::pair<size_t, std::shared_ptr<at::cuda::CUDAEvent>>> copies;  // bytes, copied-out event
#endif
};

StoreHome::StoreHome(const config::Job& job, TaskModel& model, ParamGroups& groups, const DataPlane& plane,
                     DeviceAdam& adam, Timeline* timeline, bool unheld_tasks)
    : job_(job), unheld_tasks_(unheld_tasks), model_(model), groups_(groups), plane_(plane), adam_(adam), timeline_(timeline),
      line_views_(std::make_unique<LineViews>(groups, plane.device)), inflight_(std::make_unique<InFlight>()) {
  shard_params_.assign(static_cast<size_t>(groups_.num_groups()), {});
  grad_offset_ = groups_.offset;
}

StoreHome::~StoreHome() = default;

void StoreHome::plan_params(std::vector<comm::ParamInfo>& infos) {
  for (int g = 1; g < groups_.num_groups(); ++g) {
    if (!model_.row_chunked(g)) continue;
    const int w = groups_.members[static_cast<size_t>(g)].at(0);
    const auto& t = groups_[w].tensor;
    const auto row_elems = static_cast<size_t>(t.size(1));
    infos[static_cast<size_t>(w)].numel = 0;
    for (const auto& [r0, rows] : offload::row_shards(static_cast<size_t>(t.size(0)), row_elems,
                                                      job_.offload.shard_bytes())) {
      shard_params_[static_cast<size_t>(g)].push_back(static_cast<int>(infos.size()));
      grad_offset_.push_back(r0 * row_elems);
      infos.push_back({groups_[w].name + "[" + std::to_string(r0) + ":" + std::to_string(r0 + rows) + "]",
                       rows * row_elems, g, /*alone=*/true});
    }
  }
}

comm::GradMemory StoreHome::grad_memory(int g) const {
  return model_.row_chunked(g) ? comm::GradMemory::streamed : comm::GradMemory::pooled;
}

void StoreHome::engine_options(comm::EngineOptions& o) {
  o.scratch = [this](size_t bytes) {
    std::shared_ptr<void> mem;
    // On the stream the allreduce waits for.
    plane_.on_compute_stream([&] {
      throttle_grads(bytes);
      mem = keep_for_d2h(torch::zeros({static_cast<int64_t>(bytes / sizeof(float))},
                                     torch::TensorOptions().dtype(torch::kFloat32).device(plane_.device)));
    });
    return mem;
  };
}

// (validate refuses offload with sgd: the store steps Adam/AdamW)
void StoreHome::build(HomeSetup& setup) {
  const auto t0 = SteadyClock::now();
  comm::Engine& engine = setup.engine;
  engine_ = &engine;
  take_launches_ = setup.take_launches;
  plans_ = &setup.plans;
  rank_ = setup.rank;
  std::vector<offload::GroupShape> shapes;
  for (int g = 1; g < groups_.num_groups(); ++g) {
    if (model_.row_chunked(g)) {  // one [rows x row_elems] parameter
      const auto& t = groups_[groups_.members[static_cast<size_t>(g)].at(0)].tensor;
      shapes.push_back({g, static_cast<size_t>(t.size(0)), static_cast<size_t>(t.size(1))});
      continue;
    }
    shapes.push_back({g, static_cast<size_t>(groups_.numel(g)), 1});
  }
  if (unheld_tasks_) {
    // Only a group whose parameters can be drawn again (built lazily, with init functions) may
    // stay out of the arena; the others keep their only copy of the initial values there.
    // Every group the store will ever copy, update or read through the arena: any rank's, in
    // steps [0, steps] and the store's lookahead past the last one (prefetch, the cache's
    // next-step loads), over each window's micro-steps: once, at set-up, from the schedule.
    const int64_t k = job_.accumulate_steps;
    const std::vector<uint8_t> used =
        plans_->schedule().task_groups_used_before((job_.steps + std::max<int64_t>(1, job_.offload.prefetch) + 1) * k);
    for (offload::GroupShape& s : shapes) {
      bool drawable = true;
      for (int p : groups_.members[static_cast<size_t>(s.group)]) drawable &= groups_[p].init != nullptr;
      s.held = used[static_cast<size_t>(s.group)] != 0 || !drawable;
    }
  }
  if (plane_.gpu())
    device_ = offload::make_cuda_device(plane_.device.index(), plane_.compute_stream, plane_.device_sharers);
  else
    device_ = std::make_unique<offload::HostDevice>();
  // The groups of one rank (its slots and prefetch), or of every rank (the device cache's
  // placement, which every rank must decide alike): the window plans, each computed once.
  offload::StoreOptions options = store_options(job_);
  options.cache_bytes = cache_budget();
  size_t free_bytes = 0, total = 0;
  auto_cache_pending_ = job_.offload.device_cache_auto() && device_->memory(&free_bytes, &total);
  store_ = std::make_unique<offload::ParamStore>(
      options, shapes, *device_, [this](int64_t step) { return plans_->task_groups(step, rank_, rank_); },
      [this](int64_t step) { return plans_->task_groups(step, 0, plans_->world_size() - 1); });
  // A budget given in MiB that holds no group is a mistake to say, not a cache to skip quietly.
  if (!job_.offload.device_cache_auto() && options.cache_bytes > 0 && store_->cache().cache_lines() == 0 &&
      store_->cache().cache_line_bytes() > options.cache_bytes)
    throw ConfigError(job_.source + ": offload.device_cache_mb: " + job_.offload.device_cache_mb +
                      " MiB holds no task group: one line (a group's parameters and Adam m and v) is " +
                      std::to_string(store_->cache().cache_line_bytes()) + " bytes; raise it, or set 0 for no cache");
  for (int g = 1; g < groups_.num_groups(); ++g)
    if (model_.row_chunked(g) && store_->plan().units_of(g).size() > 1 && store_->plan().slots < 2)
      throw ConfigError(job_.source + ": offload.device_slots: row-sharded groups stream two shards at a "
                        "time (the next one's copy overlaps the current one's compute), so the store "
                        "needs at least 2 device slots; it has " + std::to_string(store_->plan().slots) +
                        " (raise offload.device_slots or offload.device_budget_mb)");
  unit_param_.assign(static_cast<size_t>(store_->plan().num_units()), -1);
  for (int g = 1; g < groups_.num_groups(); ++g) {
    if (grad_memory(g) != comm::GradMemory::streamed) continue;
    const auto& units = store_->plan().units_of(g);
    const auto& shards = shard_params_[static_cast<size_t>(g)];
    THETAD_CHECK_EQ(units.size(), shards.size(), "group ", g, ": store shards vs engine shards");
    for (size_t k = 0; k < units.size(); ++k) {
      const auto p = static_cast<size_t>(shards[k]);
      THETAD_CHECK(store_->plan().unit(units[k]).offset == grad_offset_[p] &&
                       store_->plan().unit(units[k]).numel == engine.plan().params[p].numel,
                   InternalError, "group ", g, " shard ", k, ": the store's unit and the engine's bucket differ");
      unit_param_[static_cast<size_t>(units[k])] = shards[k];
    }
  }
  // Shard gradients in flight on the device: as many as the store has slots for shards.
  grad_inflight_cap_ = static_cast<size_t>(std::max<int64_t>(2, store_->plan().slots)) * store_->plan().slot_bytes;
  setup.copy_device = device_.get();  // a store built after this one copies on the same streams
  chunks_ = std::make_unique<StoreChunks>(
      *store_, plane_.device, [this](int u, torch::Tensor g) { hand_over_shard(u, std::move(g)); },
      [this](size_t bytes) { throttle_grads(bytes); });
  model_.set_shard_source(chunks_.get());
  // Each group's owner writes its initial values straight into the arena, groups in parallel:
  // lazily built parameters draw them there (no rank holds a copy of θ), others are copied.
  store_->init_all([this](int g, float* dst) {
    torch::NoGradGuard no_grad;  // thread-local: this runs on the store's threads
    for (int p : groups_.members[static_cast<size_t>(g)]) {
      const NamedParam& np = groups_[p];
      torch::Tensor view = torch::from_blob(dst + groups_.offset[static_cast<size_t>(p)], np.tensor.sizes(),
                                            torch::kFloat32);
      if (np.init) np.init(view);
      else view.copy_(np.tensor.detach());
    }
  });
  // The model's own copy of θ[t] (or its placeholder) is dropped: a placeholder of the right
  // shape and device (one element, expanded) keeps autograd's metadata until bind_group points
  // it at a slot.
  torch::NoGradGuard no_grad;
  for (int g = 1; g < groups_.num_groups(); ++g)
    for (int p : groups_.members[static_cast<size_t>(g)]) {
      if (store_->held(g)) groups_[p].init = nullptr;  // a group not held draws its values when read
      auto& t = groups_[p].tensor;
      t.set_data(torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat32).device(plane_.device))
                     .expand(t.sizes()));
    }
  THETAD_LOG(info, "offload") << "host store: " << shapes.size() << " task groups, " << store_->plan().slots
                              << " device slots of " << store_->plan().slot_bytes << " bytes, host arena "
                              << store_->arena().bytes() << " bytes";
  THETAD_LOG(info, "offload") << "host store ready in " << std::fixed << std::setprecision(2) << ms_since(t0) / 1000
                              << " s";
}

// offload.device_cache_mb: a size (no more than the device has), or auto: none at set-up. On a
// GPU, auto sizes the cache after the first step (start_window), when the allocator holds that
// step's activations and θ[t]'s gradient pool: a guess at set-up (free memory less a fifth of the
// device) gave 10,000 LoRA adapters 60 GB of lines and left the first forward out of memory.
// None on the CPU, where the host store is the memory.
size_t StoreHome::cache_budget() const {
  size_t free_bytes = 0, total = 0;
  const bool has = device_->memory(&free_bytes, &total);
  if (!job_.offload.device_cache_auto()) {
    const size_t want = job_.offload.device_cache_bytes();
    if (has && want > total)
      throw ConfigError(job_.source + ": offload.device_cache_mb: " + job_.offload.device_cache_mb +
                        " MiB is more than the device has (" + std::to_string(total >> 20) + " MiB on " +
                        device_->name() + "); lower it or set auto");
    return want;
  }
  return 0;
}

void StoreHome::start_window(const WindowPlan& plan, const WindowSettings& w) {
  const int64_t step = plan.window;
  window_ = &w;
  if (auto_cache_pending_ && prepared_steps_ > 0) {  // the first step's work is queued: size the cache
    auto_cache_pending_ = false;
    store_->cache().size_cache(offload::auto_cache_bytes(*device_, /*after_a_step=*/true));
  }
  ++prepared_steps_;
  // The previous step's gradient copies read pooled buffers that this step re-binds (and
  // zeroes on the compute stream); they started during that step's backward.
  store_->compute_after_pushes();
  param_stepped_.assign(groups_.size(), 0);
  store_->place(step);  // the device cache's loads and evictions for this step
  for (int g : plan.task_groups()) {
    const int64_t t_us = Timeline::now_us();
    bind_group(g, step);
    bind_grads(g);
    if (timeline_)
      timeline_->record(Lane::h2d, "acquire θ[" + std::to_string(g - 1) + "]", t_us, Timeline::now_us() - t_us,
                        {{"group", int64_t(g)}});
  }
  store_->prefetch_for(step);
}

// Points the parameters of an offloaded group at its device slot for this step.
void StoreHome::bind_group(int group, int64_t step) {
  if (model_.row_chunked(group)) {  // the model acquires its row shards as it streams them
    chunks_->set_step(step);
    return;
  }
  float* base = store_->cache().cached(group) ? store_->cache().cached_params(group)
                                              : store_->acquire(store_->plan().units_of(group).at(0), step);
  for (int p : groups_.members[static_cast<size_t>(group)]) {
    auto& t = groups_[p].tensor;
    t.set_data(torch::from_blob(base + groups_.offset[static_cast<size_t>(p)], t.sizes(),
                                t.options().requires_grad(false)));
  }
}

// Points an offloaded group's gradients at the engine's pool buffer bound to it this window.
void StoreHome::bind_grads(int group) {
  if (grad_memory(group) == comm::GradMemory::streamed) return;  // handed over shard by shard (StoreChunks)
  for (int p : groups_.members[static_cast<size_t>(group)]) {
    auto& t = groups_[p].tensor;
    t.mutable_grad() = torch::from_blob(engine_->grad(p), t.sizes(),
                                        torch::TensorOptions().dtype(torch::kFloat32).device(plane_.device));
  }
}

void StoreHome::before_backward(bool last, const StepPlan& plan) {
  store_->cache().order_state();  // groups streamed through transit lines: their m and v, for the update
  chunks_->set_last(last);
  if (last) hand_over_idle_shards(plan);
}

void StoreHome::after_backward(bool last) {
  if (last) chunks_->hand_over_rest();
}

// An offloaded group's bucket goes to the host landing area as soon as its allreduce is done,
// while the rest of backward runs: on GPUs the D2H stream waits for the bucket's work (the host
// does not), on the host device the copy follows the wait. Only the group's owner on this host
// copies; a group no rank used is not stepped, so nothing is copied for it. A group on a device
// line is stepped there, with optimizer.overlap as its bucket lands.
void StoreHome::on_bucket_launch(const comm::Launched& l) {
  const int b = l.bucket, contributors = l.contributors;
  comm::Work& work = *l.work;
  float* data = l.data;
  const comm::BucketPlan& plan = engine_->plan();
  const comm::Bucket& bucket = plan.buckets[static_cast<size_t>(b)];
  if (store_->cache().cached(bucket.group)) {
    if (adam_.overlap() && window_->update_known && contributors > 0)
      adam_.step_after(work, window_->for_group(bucket.group), [&](AdamOperands& ops) {
        for (size_t k = 0; k < bucket.params.size(); ++k) {
          const int p = bucket.params[k];  // a cached group is flat, never sharded: a model parameter
          add_line_operands(bucket.group, p, data + bucket.offsets[k], ops);
          param_stepped_[static_cast<size_t>(p)] = 1;
        }
      });
    return;
  }
  const bool streamed = grad_memory(bucket.group) == comm::GradMemory::streamed;
  const bool copy = contributors != 0 && store_->owns(bucket.group);
  // Streamed buckets are waited for also where nothing is copied: the engine gives their
  // memory back once the work completes (host backends: once waited for).
  if (!copy && !streamed) return;
  const int64_t t_us = Timeline::now_us();
  const auto timeout = engine_->communicator().default_timeout();
  void* d2h = store_->d2h_stream();
  if (d2h) work.block_stream(d2h, timeout);
  else work.wait(timeout);
  if (copy)
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const auto p = static_cast<size_t>(bucket.params[k]);
      store_->push_grad_range(bucket.group, grad_offset_[p], data + bucket.offsets[k], plan.params[p].numel);
    }
#if THETAD_TORCH_CUDA
  if (d2h && streamed) {  // its memory is free again once the D2H stream passes here
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    done->record(c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(d2h), plane_.device.index()));
    std::lock_guard<std::mutex> lock(inflight_mu_);
    inflight_->copies.emplace_back(bucket.numel * sizeof(float), std::move(done));
    grad_inflight_bytes_ += bucket.numel * sizeof(float);
  }
#endif
  if (copy && timeline_)
    timeline_->record(Lane::d2h, "gradient θ[" + std::to_string(bucket.group - 1) + "] bucket " + std::to_string(b),
                      t_us, Timeline::now_us() - t_us, {{"bytes", int64_t(bucket.numel * sizeof(float))}});
}

// The engine holds gradient memory of its streamed groups until their bucket's work is done, and
// the bucket's Launched until on_bucket_launch has queued its D2H copy; that copy may read it
// later still, so on GPUs the caching allocator is told about that stream too.
std::shared_ptr<void> StoreHome::keep_for_d2h(torch::Tensor t) {
#if THETAD_TORCH_CUDA
  if (void* d2h = store_ ? store_->d2h_stream() : nullptr)
    t.record_stream(c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(d2h), plane_.device.index()));
#endif
  auto holder = std::make_shared<torch::Tensor>(std::move(t));
  return std::shared_ptr<void>(holder, holder->data_ptr());
}

// Before a new shard gradient buffer: waits (host) for the oldest launched ones to be copied
// out while more than the cap would be in flight. Only launched ones are waited for (a bucket
// waiting for its turn to launch might wait for this very backward), so the cap is soft when
// launches lag.
void StoreHome::throttle_grads(size_t bytes) {
#if THETAD_TORCH_CUDA
  std::lock_guard<std::mutex> lock(inflight_mu_);
  auto& q = inflight_->copies;
  while (!q.empty() && (q.front().second->query() || grad_inflight_bytes_ + bytes > grad_inflight_cap_)) {
    q.front().second->synchronize();
    grad_inflight_bytes_ -= q.front().first;
    q.pop_front();
  }
#else
  (void)bytes;
#endif
}

// StoreChunks hands a shard's gradient of the window over: the engine reduces it in place.
void StoreHome::hand_over_shard(int unit, torch::Tensor grad) {
  const int param = unit_param_.at(static_cast<size_t>(unit));
  if (!grad.defined()) {  // no gradient in this window: later buckets need not wait for it
    take_launches_(engine_->mark_absent(param));
    return;
  }
  float* data = grad.data_ptr<float>();
  take_launches_(engine_->mark_ready(param, data, keep_for_d2h(std::move(grad))));
}

// Before the window's last backward: the shards of groups active in this window whose task that
// backward does not compute (trained in earlier micro-steps only, declared without rows) are
// handed over now, so that their buckets do not hold up the launches until finish_backward.
void StoreHome::hand_over_idle_shards(const StepPlan& last_plan) {
  for (int g = 1; g < groups_.num_groups(); ++g) {
    if (grad_memory(g) != comm::GradMemory::streamed || !engine_->locally_active(g)) continue;
    const int task = g - 1;
    bool computed = false;  // backward reaches grad_done for each of its chunks
    for (size_t i = 0; i < last_plan.tasks.size(); ++i)
      computed = computed ||
                 (last_plan.tasks[i] == task && last_plan.task_rows[i] > 0 && last_plan.trained[static_cast<size_t>(g)]);
    if (!computed) chunks_->hand_over_task(task);
  }
}

// Its reduced gradient went to the host bucket by bucket as the allreduces finished
// (on_bucket_launch); the owner clips by its norm there and steps it on the CPU.
void StoreHome::step(int g, const AdamSettings& s) {
  const int64_t t_us = Timeline::now_us();
  const bool cached = store_->cache().cached(g);
  if (cached) step_on_line(g, s);
  offload::AdamHyper h = to_hyper(s);
  h.clip_norm = job_.optimizer.clip_norm;
  store_->step_group(g, h);  // counts the update; the owner's CPU AdamW where not cached
  if (timeline_)
    timeline_->record(cached ? Lane::compute : Lane::cpu_adam,
                      "adam θ[" + std::to_string(g - 1) + "]" +
                          (cached ? (store_->cache().in_transit(g) ? " (streamed)" : " (device cache)") : ""),
                      t_us,
                      Timeline::now_us() - t_us);
}

// The device AdamW on a cached group's line, with its reduced gradient in the engine's pool (on
// the compute stream, which the engine ordered after the allreduce): the math of resident groups.
// Parameters stepped as their bucket landed (on_bucket_launch) are done.
void StoreHome::step_on_line(int g, const AdamSettings& s) {
  AdamOperands ops;
  for (int p : groups_.members[static_cast<size_t>(g)])
    if (!param_stepped_[static_cast<size_t>(p)]) add_line_operands(g, p, engine_->grad(p), ops);
  adam_.step(ops, s, job_.optimizer.clip_norm);
}

// Parameter p of group g on its line: the line's views (built when g came to it) and its gradient.
void StoreHome::add_line_operands(int g, int p, float* grad, AdamOperands& ops) {
  const LineTensors& line =
      line_views_->of(g, groups_.members[static_cast<size_t>(g)], [this](int q) { return groups_.offset[static_cast<size_t>(q)]; },
                      store_->cache().cached_params(g), store_->cache().cached_exp_avg(g), store_->cache().cached_exp_avg_sq(g));
  const auto k = static_cast<size_t>(groups_.position[static_cast<size_t>(p)]);
  ops.params.push_back(line.params[k]);
  ops.exp_avg.push_back(line.exp_avg[k]);
  ops.exp_avg_sq.push_back(line.exp_avg_sq[k]);
  ops.grads.push_back(torch::from_blob(grad, groups_[p].tensor.sizes(),
                                       torch::TensorOptions().dtype(torch::kFloat32).device(plane_.device)));
}

void StoreHome::skip(int g) { store_->discard_pushes(g); }

void StoreHome::release_step(int64_t step) { store_->release_step(step); }

void StoreHome::add_stats(StepRecord& rec) { rec.store = traffic_since(store_->stats(), last_stats_); }

HomeMemory StoreHome::device_memory() const {
  const offload::StoreStats st = store_->stats();
  HomeMemory m;
  m.lines = static_cast<int64_t>(st.device_slot_bytes + st.cache_line_bytes);
  return m;
}

}  // namespace thetad::daemon
