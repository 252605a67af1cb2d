// The pruned, bucketed allreduce engine (see engine.hpp for the step protocol).
//
// Launch order: the buckets to reduce this window ("order": globally active buckets with prune
// on, every bucket with prune off) are launched strictly in ascending bucket index, the same on
// every rank, as NCCL and MPI both require. A bucket is ready when all its parameters were marked
// since begin_sync, or at once when its group is not locally active (its buffer is zero and no
// gradient will come: it is the zero-filled stand-in for a group other ranks trained). A ready
// bucket waits for the lower-indexed buckets of the order; finish_backward launches whatever is
// left. The order (and the divisors) need the count exchange, which mark_ready never waits for:
// until it has landed, ready buckets just accumulate.
#include "comm/engine.hpp"

#include <algorithm>
#include <mutex>

#include "common/errors.hpp"
#include "common/log.hpp"

namespace thetad::comm {

using Clock = std::chrono::steady_clock;

struct Engine::Impl {
  Communicator& comm;
  Communicator& counts_comm;  // the count exchange's: EngineOptions::count_comm, else comm
  const BucketPlan& plan;
  const EngineOptions& opts;
  StepStats& stats;

  std::mutex mu;
  std::vector<std::shared_ptr<void>> buffers;  // one per bucket (null for pooled groups)
  // Pooled groups: group-sized buffers bound per window (see EngineOptions::pooled).
  std::vector<size_t> bucket_offset;           // per bucket: element offset inside its group
  size_t pool_elems = 0;                       // size of a pool buffer: the largest pooled group
  std::vector<std::shared_ptr<void>> pool;
  std::vector<int> free_slots;
  std::vector<int> slot_of_group;              // per group: bound pool buffer or -1
  std::vector<uint8_t> local_active;           // per group, this window
  std::vector<uint8_t> dirty;                  // per bucket: written since its last zeroing
  std::vector<uint8_t> stale;                  // per bucket (overwrite groups): dirty at window start
  std::vector<uint8_t> seen;                   // per param: marked at all in this window
  std::vector<uint8_t> ready;                  // per param: marked since begin_sync
  std::vector<int> pending;                    // per bucket: params not yet ready
  std::vector<uint8_t> launched;               // per bucket
  // Streamed groups: per bucket, the buffer handed over (or scratch) this window and its owner;
  // then, once launched, the owners held until their bucket's work completes.
  std::vector<float*> ext;
  std::vector<std::shared_ptr<void>> ext_keep;
  struct Held {
    WorkPtr work;
    size_t bytes;
    std::shared_ptr<void> keep;
  };
  std::vector<Held> held;
  int64_t held_bytes = 0;

  bool synced = false;     // begin_sync called in this window
  bool finished = false;   // finish_backward done in this window
  std::shared_ptr<void> count_buf;  // int32[2 x num_groups] in the communicator's memory
  WorkPtr count_work;
  bool counts_ready = false;
  std::vector<int32_t> counts;
  std::vector<int> only_root;  // per group: the one contributing rank, -1 if not exactly one
  Clock::time_point sync_start;
  double observed_exchange_ms = -1;

  bool order_ready = false;
  std::vector<int> order;  // buckets to reduce this window, ascending
  size_t next = 0;         // position in `order` of the next bucket to launch
  std::vector<WorkPtr> works;

  Impl(Communicator& c, const BucketPlan& p, const EngineOptions& o, StepStats& st)
      : comm(c), counts_comm(o.count_comm ? *o.count_comm : c), plan(p), opts(o), stats(st) {}

  // All below run with `mu` held.
  void begin_sync() {
    sync_start = Clock::now();
    // Per group: 1 if active here, then rank+1 if active here. Summed: the contributors, and
    // for a group with one contributor, that rank + 1.
    const int G = plan.num_groups;
    std::vector<int32_t> flags(2 * static_cast<size_t>(G));
    for (int g = 0; g < G; ++g) {
      flags[g] = local_active[g] ? 1 : 0;
      flags[G + g] = local_active[g] ? comm.rank() + 1 : 0;
    }
    counts_comm.copy_from_host(count_buf.get(), flags.data(), flags.size() * sizeof(int32_t));
    AllreduceOptions o;
    o.tag = CollectiveTag{"count exchange", stats.step, -1};
    o.after_compute = false;  // flags only: do not wait for forward's kernels
    count_work = counts_comm.allreduce(count_buf.get(), flags.size(), DType::i32, o);
    synced = true;
    std::fill(ready.begin(), ready.end(), 0);
    for (const Bucket& b : plan.buckets) pending[b.index] = static_cast<int>(b.params.size());
  }

  // Fetches the counts once the exchange has landed; with `block`, waits for it.
  bool fetch_counts(bool block) {
    if (counts_ready) return true;
    if (!count_work) return false;
    if (!block && !count_work->is_completed()) return false;
    count_work->wait(opts.timeout);
    std::vector<int32_t> sums(2 * counts.size());
    counts_comm.copy_to_host(sums.data(), count_buf.get(), sums.size() * sizeof(int32_t));
    std::copy(sums.begin(), sums.begin() + static_cast<std::ptrdiff_t>(counts.size()), counts.begin());
    for (size_t g = 0; g < counts.size(); ++g) only_root[g] = counts[g] == 1 ? sums[counts.size() + g] - 1 : -1;
    observed_exchange_ms = std::chrono::duration<double, std::milli>(Clock::now() - sync_start).count();
    counts_ready = true;
    return true;
  }

  // Builds the launch order once it is known. With prune off and average world it needs no
  // counts, so launching can start before the exchange lands.
  bool ensure_order(bool block) {
    if (order_ready) return true;
    const bool need_counts = opts.prune || opts.average == Average::contributors;
    if (need_counts && !fetch_counts(block)) return false;
    order.clear();
    for (const Bucket& b : plan.buckets)
      if (!opts.prune || counts[b.group] > 0) order.push_back(b.index);
    order_ready = true;
    return true;
  }

  bool pooled(int g) const { return !opts.pooled.empty() && opts.pooled[g]; }
  bool overwrite(int g) const { return !opts.overwrite.empty() && opts.overwrite[g]; }
  bool streamed(int g) const { return !opts.streamed.empty() && opts.streamed[g]; }

  // Streamed bucket b without a handed-over buffer: zeroed scratch memory.
  float* scratch(int b) {
    const size_t bytes = plan.buckets[b].numel * sizeof(float);
    std::shared_ptr<void> mem;
    if (opts.scratch) {
      mem = opts.scratch(bytes);
    } else {
      mem = comm.allocate(bytes);
      comm.zero(mem.get(), bytes);
    }
    if (!mem) throw InternalError(detail::concat("no scratch memory for streamed bucket ", b));
    release_held(false);  // the callback may have waited for earlier buckets
    hold_bytes(static_cast<int64_t>(bytes));
    ext[b] = static_cast<float*>(mem.get());
    ext_keep[b] = std::move(mem);
    return ext[b];
  }

  void hold_bytes(int64_t bytes) {
    held_bytes += bytes;
    stats.streamed_bytes_peak = std::max(stats.streamed_bytes_peak, held_bytes);
  }

  // Drops the owners of streamed buffers whose bucket's work has completed (all: `all`).
  void release_held(bool all) {
    held.erase(std::remove_if(held.begin(), held.end(),
                              [&](const Held& h) {
                                if (!all && !h.work->is_completed()) return false;
                                held_bytes -= static_cast<int64_t>(h.bytes);
                                return true;
                              }),
               held.end());
  }

  // Overwrite groups: before bucket b is reduced, zeroes what no gradient overwrote this window
  // (runs of unseen parameters), unless the buffer is already zero.
  void zero_unwritten(int b) {
    const Bucket& bucket = plan.buckets[b];
    if (!overwrite(bucket.group) || !stale[b]) return;
    float* base = bucket_ptr(b);
    size_t i = 0;
    while (i < bucket.params.size()) {
      if (seen[bucket.params[i]]) {
        ++i;
        continue;
      }
      const size_t begin = bucket.offsets[i];
      size_t end = begin;
      while (i < bucket.params.size() && !seen[bucket.params[i]]) end += plan.params[bucket.params[i++]].numel;
      comm.zero(base + begin, (end - begin) * sizeof(float));
    }
  }

  // Binds a pooled group to a zeroed pool buffer for this window (allocating one if none is
  // free: the pool grows to the most groups one window uses).
  float* group_base(int g) {
    if (slot_of_group[g] < 0) {
      int slot;
      if (!free_slots.empty()) {
        slot = free_slots.back();
        free_slots.pop_back();
      } else {
        slot = static_cast<int>(pool.size());
        pool.push_back(comm.allocate(pool_elems * sizeof(float)));
      }
      comm.zero(pool[slot].get(), pool_elems * sizeof(float));
      slot_of_group[g] = slot;
    }
    return static_cast<float*>(pool[slot_of_group[g]].get());
  }

  float* bucket_ptr(int b) {
    const int g = plan.buckets[b].group;
    if (streamed(g)) return ext[b] ? ext[b] : scratch(b);
    if (pooled(g)) return group_base(g) + bucket_offset[b];
    return static_cast<float*>(buffers[b].get());
  }

  bool bucket_ready(int b) const { return pending[b] == 0 || !local_active[plan.buckets[b].group]; }

  void launch(int b) {
    const Bucket& bucket = plan.buckets[b];
    AllreduceOptions o;
    o.op = ReduceOp::sum;
    if (opts.average == Average::world)
      o.divisor = comm.size();
    else
      o.divisor = std::max<int32_t>(1, counts[bucket.group]);  // 0 only with prune off: zeros
    o.tag = CollectiveTag{"allreduce", stats.step, b};
    if (counts_ready && opts.broadcast_min_ranks > 0 && comm.size() >= opts.broadcast_min_ranks &&
        only_root[bucket.group] >= 0) {
      o.from_root = only_root[bucket.group];
      stats.buckets_broadcast += 1;
    }
    float* data = bucket_ptr(b);
    if (o.from_root < 0 || o.from_root == comm.rank()) zero_unwritten(b);  // else overwritten
    const auto t0 = Clock::now();
    works.push_back(comm.allreduce(data, bucket.numel, DType::f32, o));
    const auto t1 = Clock::now();
    stats.launch_call_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
    if (opts.on_launch) {
      fetch_counts(/*block=*/false);  // prune off, average world: maybe not fetched yet
      opts.on_launch(b, counts_ready ? counts[bucket.group] : -1, *works.back(), data);
      stats.on_launch_ms += std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
    }
    if (streamed(bucket.group)) {
      held.push_back({works.back(), bucket.numel * sizeof(float), std::move(ext_keep[b])});
      ext[b] = nullptr;
    }
    launched[b] = 1;
    dirty[b] = 1;
    stats.buckets_launched += 1;
    stats.bytes_allreduced += static_cast<int64_t>(bucket.numel * sizeof(float));
    if (!local_active[bucket.group]) stats.buckets_zero_filled += 1;
  }

  // Launches ready buckets in order; `all` launches every remaining one (finish_backward).
  void run(bool all) {
    if (!ensure_order(all)) return;
    while (next < order.size()) {
      const int b = order[next];
      if (!all && !bucket_ready(b)) break;
      launch(b);
      ++next;
    }
  }
};

Engine::Engine(std::shared_ptr<Communicator> comm, BucketPlan plan, EngineOptions opts)
    : comm_(std::move(comm)), plan_(std::move(plan)), opts_(opts) {
  if (!comm_) throw InternalError("Engine needs a communicator");
  impl_ = std::make_unique<Impl>(*comm_, plan_, opts_, stats_);
  if (plan_.num_groups < 1) throw InternalError("Engine needs a bucket plan with at least one group");
  if (plan_.options.elem_size != sizeof(float))
    throw ConfigError("the engine reduces float32 gradients; the bucket plan must use elem_size 4");
  Impl& s = *impl_;
  const size_t nb = plan_.buckets.size(), np = plan_.param_bucket.size();
  if (!opts_.pooled.empty() && static_cast<int>(opts_.pooled.size()) != plan_.num_groups)
    throw InternalError("EngineOptions::pooled needs one flag per group");
  if (!opts_.overwrite.empty() && static_cast<int>(opts_.overwrite.size()) != plan_.num_groups)
    throw InternalError("EngineOptions::overwrite needs one flag per group");
  if (!opts_.streamed.empty() && static_cast<int>(opts_.streamed.size()) != plan_.num_groups)
    throw InternalError("EngineOptions::streamed needs one flag per group");
  for (int g = 0; g < plan_.num_groups; ++g)
    if (static_cast<int>(s.overwrite(g)) + static_cast<int>(s.pooled(g)) + static_cast<int>(s.streamed(g)) > 1)
      throw InternalError(detail::concat("group ", g, " can be only one of pooled, overwrite and streamed"));
  for (const Bucket& b : plan_.buckets)
    if (s.streamed(b.group) && b.params.size() != 1)
      throw InternalError(detail::concat("bucket ", b.index, " of streamed group ", b.group, " holds ",
                                         b.params.size(), " parameters; streamed parameters need a "
                                         "bucket of their own (ParamInfo::alone)"));
  std::vector<size_t> group_elems(plan_.num_groups, 0);
  for (const Bucket& b : plan_.buckets) {
    s.bucket_offset.push_back(group_elems[b.group]);
    group_elems[b.group] += b.numel;
    const bool own = !s.pooled(b.group) && !s.streamed(b.group);
    s.buffers.push_back(own ? comm_->allocate(b.numel * sizeof(float)) : nullptr);
  }
  for (int g = 0; g < plan_.num_groups; ++g)
    if (s.pooled(g)) s.pool_elems = std::max(s.pool_elems, group_elems[g]);
  s.slot_of_group.assign(plan_.num_groups, -1);
  s.local_active.assign(plan_.num_groups, 0);
  s.dirty.assign(nb, 0);
  s.stale.assign(nb, 0);
  s.seen.assign(np, 0);
  s.ready.assign(np, 0);
  s.pending.assign(nb, 0);
  s.launched.assign(nb, 0);
  s.ext.assign(nb, nullptr);
  s.ext_keep.assign(nb, nullptr);
  s.counts.assign(plan_.num_groups, 0);
  s.only_root.assign(plan_.num_groups, -1);
  s.count_buf = s.counts_comm.allocate(2 * plan_.num_groups * sizeof(int32_t));
  THETAD_LOG(info, "comm") << "engine: " << nb << " buckets over " << plan_.num_groups
                           << " groups on " << comm_->backend_name() << ", prune "
                           << (opts_.prune ? "on" : "off") << ", average "
                           << (opts_.average == Average::contributors ? "contributors" : "world");
}

Engine::~Engine() = default;

float* Engine::bucket_data(int bucket) {
  if (bucket < 0 || bucket >= static_cast<int>(plan_.buckets.size()))
    throw InternalError(detail::concat("no bucket ", bucket));
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->streamed(plan_.buckets[bucket].group))
    throw InternalError(detail::concat("bucket ", bucket, " is streamed: the caller holds its memory"));
  return impl_->bucket_ptr(bucket);
}

size_t Engine::buffer_bytes() const {
  size_t bytes = 0;
  for (size_t b = 0; b < plan_.buckets.size(); ++b)
    if (impl_->buffers[b]) bytes += plan_.buckets[b].numel * sizeof(float);
  return bytes + impl_->pool.size() * impl_->pool_elems * sizeof(float);
}

float* Engine::grad(int param) {
  if (param < 0 || param >= static_cast<int>(plan_.param_bucket.size()))
    throw InternalError(detail::concat("no gradient buffer for parameter ", param));
  if (impl_->streamed(plan_.params[static_cast<size_t>(param)].group))
    throw InternalError(detail::concat("parameter ", param, " is streamed: the caller holds its gradient"));
  if (plan_.param_bucket[param] < 0) {  // no elements: a valid address of nothing
    static float nothing = 0.0f;
    return &nothing;
  }
  return bucket_data(plan_.param_bucket[param]) + plan_.param_offset[param];
}

void Engine::start_window(int64_t step) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& s = *impl_;
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    s.stale[b] = s.dirty[b];
    if (s.dirty[b] && !s.overwrite(plan_.buckets[b].group)) {  // overwrite: zero_unwritten
      if (s.buffers[b]) comm_->zero(s.buffers[b].get(), plan_.buckets[b].numel * sizeof(float));
      s.dirty[b] = 0;
    }
  }
  // Pooled groups give their buffers back; a group bound again is zeroed then.
  for (int g = 0; g < plan_.num_groups; ++g)
    if (s.slot_of_group[g] >= 0) {
      s.free_slots.push_back(s.slot_of_group[g]);
      s.slot_of_group[g] = -1;
    }
  std::fill(s.local_active.begin(), s.local_active.end(), 0);
  std::fill(s.seen.begin(), s.seen.end(), 0);
  std::fill(s.ready.begin(), s.ready.end(), 0);
  std::fill(s.launched.begin(), s.launched.end(), 0);
  std::fill(s.ext.begin(), s.ext.end(), nullptr);
  std::fill(s.ext_keep.begin(), s.ext_keep.end(), nullptr);
  s.release_held(true);
  s.held_bytes = 0;
  s.synced = s.finished = s.counts_ready = s.order_ready = false;
  s.count_work.reset();
  s.observed_exchange_ms = -1;
  s.order.clear();
  s.next = 0;
  s.works.clear();
  stats_ = StepStats{};
  stats_.step = step;
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
  impl_->fetch_counts(true);
  return impl_->counts;
}

bool Engine::group_active_globally(int group) {
  if (group < 0 || group >= plan_.num_groups) throw InternalError(detail::concat("no group ", group));
  return contributors()[group] > 0;
}

void Engine::mark_ready(int param) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (param < 0 || param >= static_cast<int>(plan_.param_bucket.size()))
    throw InternalError(detail::concat("mark_ready: no parameter ", param));
  const int b = plan_.param_bucket[param];
  if (b < 0) return;  // a placeholder without elements
  if (impl_->streamed(plan_.buckets[b].group))
    throw InternalError(detail::concat("mark_ready: parameter ", param, " is streamed: hand its gradient over"));
  mark_locked(param);
}

// The bucket of a streamed parameter whose gradient (or its absence) may be given now: after
// begin_sync, once per window, before the bucket launched. Engine lock held.
int Engine::streamed_bucket(const char* call, int param) {
  Impl& s = *impl_;
  if (param < 0 || param >= static_cast<int>(plan_.param_bucket.size()) || plan_.param_bucket[param] < 0)
    throw InternalError(detail::concat(call, ": no bucket for parameter ", param));
  const int b = plan_.param_bucket[param];
  if (!s.streamed(plan_.buckets[b].group))
    throw InternalError(detail::concat(call, ": parameter ", param, " is not streamed"));
  if (!s.synced || s.ready[param] || s.launched[b] || s.ext[b])
    throw InternalError(detail::concat(call, ": parameter ", param, " of a streamed group must be given "
                                       "once per window, after begin_sync, before its bucket launched"));
  check_declared(param);
  return b;
}

void Engine::mark_ready(int param, float* data, std::shared_ptr<void> keep) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& s = *impl_;
  if (!data) throw InternalError(detail::concat("mark_ready: no data for parameter ", param));
  const int b = streamed_bucket("mark_ready", param);
  s.ext[b] = data;
  s.ext_keep[b] = std::move(keep);
  s.hold_bytes(static_cast<int64_t>(plan_.buckets[b].numel * sizeof(float)));
  // The launch order needs the counts: rather than pile up handed-over buffers until they land,
  // wait for them (posted before backward by every rank, normally long done).
  s.fetch_counts(/*block=*/true);
  mark_locked(param);
  s.release_held(false);
}

void Engine::mark_absent(int param) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& s = *impl_;
  const int b = streamed_bucket("mark_absent", param);
  // Ready without a gradient (it still counts in declared_without_grad); nothing is held: the
  // bucket's scratch memory is taken when it launches.
  s.ready[param] = 1;
  s.pending[b] -= 1;
  s.run(false);
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

void Engine::mark_locked(int param) {
  Impl& s = *impl_;
  const int b = plan_.param_bucket[param];
  s.dirty[b] = 1;  // autograd already wrote into the view
  check_declared(param);
  s.seen[param] = 1;
  if (!s.synced || s.finished || s.ready[param]) return;
  s.ready[param] = 1;
  s.pending[b] -= 1;
  s.run(false);
}

void Engine::finish_backward() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& s = *impl_;
  if (s.finished) throw InternalError("finish_backward called twice in one window");
  if (!s.synced) s.begin_sync();  // a window without begin_sync: exchange now
  const auto t0 = Clock::now();
  s.ensure_order(true);
  const auto t1 = Clock::now();
  const size_t before = s.works.size();
  s.run(true);
  const auto t2 = Clock::now();
  stats_.finish_order_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  stats_.finish_launch_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
  stats_.finish_launched = static_cast<int>(s.works.size() - before);
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
  s.release_held(true);
  s.fetch_counts(true);  // for the stats, also when the order needed none
  stats_.comm_wait_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  for (const Bucket& b : plan_.buckets)
    if (!s.launched[b.index]) {
      stats_.buckets_pruned += 1;
      stats_.bytes_pruned += static_cast<int64_t>(b.numel * sizeof(float));
    }
  for (size_t p = 0; p < s.seen.size(); ++p)
    if (!s.seen[p] && plan_.param_bucket[p] >= 0 && s.local_active[plan_.buckets[plan_.param_bucket[p]].group])
      stats_.declared_without_grad += 1;
  const double exchange = s.count_work ? s.count_work->elapsed_ms() : -1.0;
  stats_.count_exchange_ms = exchange >= 0 ? exchange : s.observed_exchange_ms;
  stats_.contributors = s.counts;
  s.finished = true;
  THETAD_LOG(debug, "comm") << "step " << stats_.step << ": " << stats_.buckets_launched
                            << " buckets launched (" << stats_.bytes_allreduced << " B), "
                            << stats_.buckets_pruned << " pruned, wait " << stats_.comm_wait_ms << " ms";
}

}  // namespace thetad::comm
