// The pruned, bucketed allreduce engine (see engine.hpp for the step protocol): its calls, their
// checks and the end of a window. The window's state and the launch order: engine/window.hpp;
// gradient memory: engine/grad_buffers; the count exchange: engine/count_exchange.
#include "comm/engine.hpp"

#include <algorithm>
#include <mutex>

#include "comm/engine/window.hpp"
#include "common/errors.hpp"
#include "common/leak_on_purpose.hpp"
#include "common/log.hpp"

namespace thetad::comm {

using Clock = std::chrono::steady_clock;


Engine::Engine(std::shared_ptr<Communicator> comm, BucketPlan plan, EngineOptions opts)
    : comm_(std::move(comm)), plan_(std::move(plan)), opts_(std::move(opts)) {
  if (!comm_) throw InternalError("Engine needs a communicator");
  if (plan_.num_groups < 1) throw InternalError("Engine needs a bucket plan with at least one group");
  if (plan_.options.elem_size != sizeof(float))
    throw InternalError("the engine reduces float32 gradients; the bucket plan must use elem_size 4");
  if (opts_.wire != DType::f32 && opts_.wire != DType::bf16)
    throw InternalError(std::string("the engine's buckets travel as float32 or bfloat16, not ") + dtype_name(opts_.wire));
  impl_ = std::make_unique<Impl>(*comm_, plan_, opts_, stats_);
  THETAD_LOG(info, "comm") << "engine: " << plan_.buckets.size() << " buckets over " << plan_.num_groups
                           << " groups on " << comm_->backend_name() << ", prune "
                           << (opts_.prune ? "on" : "off") << ", average "
                           << (opts_.average == Average::contributors ? "contributors" : "world") << ", on the wire "
                           << dtype_name(opts_.wire);
  int adopted = 0;
  for (int g = 0; g < plan_.num_groups; ++g) adopted += impl_->buffers.adopted(g) ? 1 : 0;
  if (adopted > 0) {
    THETAD_LOG(info, "comm") << "engine: " << adopted << " of " << plan_.num_groups
                             << " groups' gradients adopted from autograd (a world of one: no buckets, no copies)";
  }
}

// An error that unwound a step can leave collectives in flight that still write into the engine's
// memory (the count exchange's result, the buckets): freeing it under them corrupted the heap
// when two ranks failed together and their exchange landed after the unwinding. Such an engine
// leaves its memory allocated; the process is ending with that error anyway.
Engine::~Engine() {
  if (!impl_ || !impl_->in_flight()) return;
  THETAD_LOG(warn, "comm") << "engine destroyed with collectives in flight: its buffers are left allocated";
  (void)leak_on_purpose(impl_.release());
}

float* Engine::bucket_data(int bucket) {
  if (bucket < 0 || bucket >= static_cast<int>(plan_.buckets.size()))
    throw InternalError(detail::concat("no bucket ", bucket));
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->buffers.streamed(plan_.buckets[bucket].group))
    throw InternalError(detail::concat("bucket ", bucket, " is streamed: the caller holds its memory"));
  return impl_->buffers.bucket_ptr(bucket);
}

size_t Engine::buffer_bytes() const { return impl_->buffers.bytes(); }

float* Engine::grad(int param) {
  if (param < 0 || param >= static_cast<int>(plan_.param_bucket.size()))
    throw InternalError(detail::concat("no gradient buffer for parameter ", param));
  const int group = plan_.params[static_cast<size_t>(param)].group;
  if (impl_->buffers.streamed(group))
    throw InternalError(detail::concat("parameter ", param, " is streamed: the caller holds its gradient"));
  if (plan_.param_bucket[param] < 0) {  // no elements: a valid address of nothing
    static float nothing = 0.0f;
    return &nothing;
  }
  if (impl_->buffers.adopted(group)) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    return impl_->buffers.adopted_grad(param, /*zeros_if_none=*/true);
  }
  return bucket_data(plan_.param_bucket[param]) + plan_.param_offset[param];
}

void Engine::adopt(int param, float* data) {
  if (param < 0 || param >= static_cast<int>(plan_.param_bucket.size()) ||
      !impl_->buffers.adopted(plan_.params[static_cast<size_t>(param)].group) || data == nullptr)
    throw InternalError(detail::concat("adopt: parameter ", param, " is not of an adopted group, or no gradient"));
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->buffers.adopt(param, data);
}

float* Engine::adopted_grad(int param) const { return impl_->buffers.adopted_grad(param, /*zeros_if_none=*/false); }

size_t Engine::adopted_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->buffers.adopted_bytes();
}

void Engine::start_window(int64_t step) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& s = *impl_;
  s.buffers.start_window();
  std::fill(s.local_active.begin(), s.local_active.end(), 0);
  std::fill(s.seen.begin(), s.seen.end(), 0);
  std::fill(s.ready.begin(), s.ready.end(), 0);
  std::fill(s.launched.begin(), s.launched.end(), 0);
  s.synced = s.finished = s.order_ready = false;
  s.counts.reset();
  s.order.clear();
  s.next = 0;
  s.works.clear();
  std::fill(s.keeper.begin(), s.keeper.end(), -1);
  std::fill(s.kept.begin(), s.kept.end(), 0);
  s.any_keeper = false;
  stats_ = StepStats{};
  stats_.step = step;
  s.timer.harvest(stats_);  // the last window's buckets that completed since its stats
}

void Engine::keep(int group, int rank) {
  if (group < 0 || group >= plan_.num_groups || rank < 0 || rank >= comm_->size())
    throw InternalError(detail::concat("keep: no group ", group, " or rank ", rank));
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& s = *impl_;
  const GradMemory m = s.buffers.mode(group);
  if (m != GradMemory::owned && m != GradMemory::overwrite && m != GradMemory::pooled)
    throw InternalError(detail::concat("keep: group ", group, "'s gradients are not in engine buffers of its own"));
  if (s.synced) throw InternalError("keep after begin_sync: the launch order may already be known");
  s.keeper[static_cast<size_t>(group)] = rank;
  s.any_keeper = true;
}

int Engine::kept_by(int group) {
  if (group < 0 || group >= plan_.num_groups) throw InternalError(detail::concat("no group ", group));
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& s = *impl_;
  if (!s.synced) throw InternalError("kept_by() before begin_sync()");
  if (!s.any_keeper) return -1;
  s.counts.fetch(true);
  return s.kept_group(group) ? s.keeper[static_cast<size_t>(group)] : -1;
}

void Engine::declare_active(const std::vector<uint8_t>& local_groups) {
  if (static_cast<int>(local_groups.size()) != plan_.num_groups)
    throw InternalError(detail::concat("declare_active got ", local_groups.size(), " flags for ",
                                       plan_.num_groups, " groups"));
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->synced)
    throw InternalError("declare_active after begin_sync: the count exchange already started");
  for (int g = 0; g < plan_.num_groups; ++g)
    if (local_groups[g]) impl_->local_active[g] = 1;
}

void Engine::begin_sync() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& s = *impl_;
  if (s.synced) throw InternalError("begin_sync called twice in one window");
  s.begin_sync();
}

const std::vector<int32_t>& Engine::contributors() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!impl_->synced) throw InternalError("contributors() before begin_sync()");
  impl_->counts.fetch(true);
  return impl_->counts.counts();
}

bool Engine::group_active_globally(int group) {
  if (group < 0 || group >= plan_.num_groups) throw InternalError(detail::concat("no group ", group));
  return contributors()[group] > 0;
}

Launches Engine::mark_ready(int param) {
  Launches out;
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (param < 0 || param >= static_cast<int>(plan_.param_bucket.size()))
    throw InternalError(detail::concat("mark_ready: no parameter ", param));
  const int b = plan_.param_bucket[param];
  if (b < 0) return out;  // a placeholder without elements
  if (impl_->buffers.streamed(plan_.buckets[b].group))
    throw InternalError(detail::concat("mark_ready: parameter ", param, " is streamed: hand its gradient over"));
  mark_locked(param, out);
  return out;
}

// The bucket of a streamed parameter whose gradient (or its absence) may be given now: after
// begin_sync, once per window, before the bucket launched. Engine lock held.
int Engine::streamed_bucket(const char* call, int param) {
  Impl& s = *impl_;
  if (param < 0 || param >= static_cast<int>(plan_.param_bucket.size()) || plan_.param_bucket[param] < 0)
    throw InternalError(detail::concat(call, ": no bucket for parameter ", param));
  const int b = plan_.param_bucket[param];
  if (!s.buffers.streamed(plan_.buckets[b].group))
    throw InternalError(detail::concat(call, ": parameter ", param, " is not streamed"));
  if (!s.synced || s.ready[param] || s.launched[b] || s.buffers.handed_over(b))
    throw InternalError(detail::concat(call, ": parameter ", param, " of a streamed group must be given "
                                       "once per window, after begin_sync, before its bucket launched"));
  check_declared(param);
  return b;
}

Launches Engine::mark_ready(int param, float* data, std::shared_ptr<void> keep) {
  Launches out;
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& s = *impl_;
  if (!data) throw InternalError(detail::concat("mark_ready: no data for parameter ", param));
  const int b = streamed_bucket("mark_ready", param);
  s.buffers.hand_over(b, data, std::move(keep));
  // The launch order needs the counts: rather than pile up handed-over buffers until they land,
  // wait for them (posted before backward by every rank, normally long done).
  s.counts.fetch(/*block=*/true);
  mark_locked(param, out);
  s.buffers.release_held(false);
  return out;
}

Launches Engine::mark_absent(int param) {
  Launches out;
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& s = *impl_;
  const int b = streamed_bucket("mark_absent", param);
  // Ready without a gradient (it still counts in declared_without_grad); nothing is held: the
  // bucket's scratch memory is taken when it launches.
  s.ready[param] = 1;
  s.pending[b] -= 1;
  s.run(false, out, /*paced=*/true);
  return out;
}

bool Engine::locally_active(int group) const {
  if (group < 0 || group >= plan_.num_groups) throw InternalError(detail::concat("no group ", group));
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->local_active[static_cast<size_t>(group)] != 0;
}

// A gradient for a group not active on this rank: an error once the exchange started (or in
// declared mode); in discover mode before it, the group becomes active.
void Engine::check_declared(int param) {
  Impl& s = *impl_;
  const int g = plan_.buckets[plan_.param_bucket[param]].group;
  if (s.local_active[g]) return;
  const std::string name =
      param < static_cast<int>(plan_.params.size()) ? plan_.params[param].name : std::to_string(param);
  if (opts_.declared || s.synced)
    throw ConfigError(detail::concat(
        "gradient for parameter '", name, "' of group ", g, " at step ", stats_.step,
        ", but this rank did not declare group ", g,
        " active in this step (declare every task the batch trains, or freeze the group)"));
  s.local_active[g] = 1;  // discover mode, before the exchange: still in time
}

void Engine::mark_locked(int param, Launches& out) {
  Impl& s = *impl_;
  const int b = plan_.param_bucket[param];
  s.buffers.mark_written(b);  // autograd already wrote into the view
  check_declared(param);
  s.seen[param] = 1;
  if (!s.synced || s.finished || s.ready[param]) return;
  s.ready[param] = 1;
  s.pending[b] -= 1;
  s.run(false, out, /*paced=*/true);
}

Launches Engine::launch_ready() {
  Launches out;
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& s = *impl_;
  if (s.synced && !s.finished) s.run(false, out, /*paced=*/true);
  return out;
}

Launches Engine::launch_rest() {
  Launches out;
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->finished) throw InternalError("launch_rest after finish_backward");
  impl_->launch_rest(out, /*paced=*/true);
  return out;
}

Launches Engine::finish_backward() {
  Launches out;
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& s = *impl_;
  if (s.finished) throw InternalError("finish_backward called twice in one window");
  const auto t0 = Clock::now();
  s.launch_rest(out, /*paced=*/false);
  const auto t2 = Clock::now();
  for (const Bucket& b : plan_.buckets)
    if (s.kept[b.index]) s.finish_kept(b.index);
  if (opts_.wait_stream && comm_->completes_in_order()) {
    // One stream wait for the last bucket orders the stream after all of them: fewer commands
    // in a compute queue that the host has filled a step ahead.
    if (!s.works.empty()) s.works.back()->block_stream(opts_.wait_stream, opts_.timeout);
  } else {
    for (auto& w : s.works) {
      if (opts_.wait_stream) w->block_stream(opts_.wait_stream, opts_.timeout);
      else w->wait(opts_.timeout);
    }
  }
  stats_.finish_block_ms = std::chrono::duration<double, std::milli>(Clock::now() - t2).count();
  // Streamed buffers: the wait stream (or the host) is now after every bucket.
  s.buffers.release_held(true);
  s.counts.fetch(true);  // for the stats, also when the order needed none
  stats_.comm_wait_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  for (const Bucket& b : plan_.buckets)
    if (!s.launched[b.index] && !s.kept[b.index]) {
      stats_.buckets_pruned += 1;
      stats_.bytes_pruned += static_cast<int64_t>(b.numel * dtype_size(opts_.wire));
    }
  // Over the locally active groups' buckets only: 10,000 adapters are 1.28 M parameters.
  for (size_t g = 0; g < plan_.group_buckets.size(); ++g) {
    if (!s.local_active[g]) continue;
    for (int b : plan_.group_buckets[g])
      for (int p : plan_.buckets[static_cast<size_t>(b)].params)
        if (!s.seen[static_cast<size_t>(p)]) stats_.declared_without_grad += 1;
  }
  stats_.count_exchange_ms = s.counts.latency_ms();
  stats_.contributors = s.counts.counts();
  s.timer.harvest(stats_);
  s.finished = true;
  THETAD_LOG(debug, "comm") << "step " << stats_.step << ": " << stats_.buckets_launched
                            << " buckets launched (" << stats_.bytes_allreduced << " B), "
                            << stats_.buckets_pruned << " pruned, wait " << stats_.comm_wait_ms << " ms";
  return out;
}

}  // namespace thetad::comm
