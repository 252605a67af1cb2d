// The host-resident parameter store (see param_store.hpp): unit planning and slot sizing,
// acquire/prefetch over the slot cache, gradient landing and the owner's CPU optimizer step.
#include "offload/param_store.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "offload/thread_pool.hpp"

namespace thetad::offload {
namespace {

// How far ahead the schedule is read to rank eviction candidates; beyond it a unit's next use
// counts as unknown (LRU among those).
constexpr int64_t kFutureHorizon = 64;

double mib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// memcpy (src null: memset 0) on the CPU Adam threads: startup and resume write whole groups
// of 100+ MB, 4 buffers each (T = 256: 137 GB).
void parallel_copy(void* dst, const void* src, size_t bytes) {
  constexpr size_t kChunk = size_t{8} << 20;
  const size_t chunks = (bytes + kChunk - 1) / kChunk;
  ThreadPool::instance().parallel_for(chunks, [&](size_t c) {
    const size_t off = c * kChunk, len = std::min(kChunk, bytes - off);
    if (src) std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, len);
    else std::memset(static_cast<char*>(dst) + off, 0, len);
  });
}

}  // namespace

ParamStore::ParamStore(const StoreOptions& opts, std::vector<GroupShape> groups, Device& device,
                       Schedule groups_needed_at, MPI_Comm comm)
    : opts_(opts), device_(device), schedule_(std::move(groups_needed_at)),
      groups_(std::move(groups)), cache_(1) {
  THETAD_CHECK(schedule_ != nullptr, InternalError, "ParamStore needs a schedule");
  THETAD_CHECK(opts_.prefetch >= 0, ConfigError, "offload.prefetch must be >= 0 (got ",
               opts_.prefetch, ")");
  if (opts_.device_budget_bytes == 0)
    THETAD_CHECK(opts_.device_slots >= 1, ConfigError, "offload.device_slots must be >= 1 (got ",
                 opts_.device_slots, "), or set offload.device_budget_mb");

  // Units: a group, or row shards of at most shard_bytes each.
  std::vector<ArenaEntry> entries;
  group_units_.resize(groups_.size());
  size_t largest = 0;
  int largest_unit = -1;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const GroupShape& g = groups_[gi];
    THETAD_CHECK(g.group >= 1, InternalError, "group ", g.group,
                 " cannot be offloaded (group 0, the shared Θ, stays on the device)");
    THETAD_CHECK(g.rows > 0 && g.row_elems > 0, InternalError, "group ", g.group, " is empty");
    THETAD_CHECK(index_.emplace(g.group, gi).second, InternalError, "group ", g.group,
                 " given twice");
    const size_t row_bytes = g.row_elems * sizeof(float);
    const size_t bytes = g.rows * row_bytes;
    if (opts_.shard_bytes > 0 && bytes > opts_.shard_bytes)
      THETAD_CHECK(row_bytes <= opts_.shard_bytes, ConfigError, "offload: one row of group ",
                   g.group, " is ", mib(row_bytes), " MiB, larger than offload.shard_mb (",
                   mib(opts_.shard_bytes), " MiB); groups are sharded by rows, raise offload.shard_mb");
    const auto shards = row_shards(g.rows, g.row_elems, opts_.shard_bytes);
    for (size_t k = 0; k < shards.size(); ++k) {
      const size_t r = shards[k].first;
      UnitInfo u;
      u.group = g.group;
      u.shard = static_cast<int>(k);
      u.row_begin = r;
      u.rows = shards[k].second;
      u.row_elems = g.row_elems;
      u.numel = u.rows * u.row_elems;
      u.offset = r * g.row_elems;
      group_units_[gi].push_back(static_cast<int>(units_.size()));
      if (u.numel * sizeof(float) > largest) {
        largest = u.numel * sizeof(float);
        largest_unit = static_cast<int>(units_.size());
      }
      units_.push_back(u);
    }
    entries.push_back({g.group, g.rows * g.row_elems});
  }

  // Slots: all the same size, that of the largest unit.
  slot_bytes_ = largest;
  int64_t nslots = opts_.device_slots;
  if (opts_.device_budget_bytes > 0) {
    const UnitInfo& big = units_.at(static_cast<size_t>(std::max(largest_unit, 0)));
    THETAD_CHECK(largest <= opts_.device_budget_bytes, ConfigError, "offload: group ", big.group,
                 (opts_.shard_bytes > 0 ? " shard " : ""),
                 (opts_.shard_bytes > 0 ? std::to_string(big.shard) : std::string()), " needs ",
                 mib(largest), " MiB on the device but offload.device_budget_mb is ",
                 mib(opts_.device_budget_bytes),
                 " MiB; raise offload.device_budget_mb or set offload.shard_mb (<= the budget) to "
                 "split large groups into row shards");
    nslots = static_cast<int64_t>(opts_.device_budget_bytes / largest);
  }
  nslots = std::min<int64_t>(nslots, static_cast<int64_t>(units_.size()));  // more is waste
  cache_ = SlotCache(std::max<int64_t>(nslots, 1));

  // Collective from here on; every rank reached it with the same decisions.
  arena_ = std::make_unique<HostArena>(comm, entries, opts_.host_limit_bytes, &device_);

  // Every rank learns whether all got their device slots: a rank failing alone would otherwise
  // leave the others waiting in the next collective while its arena's (collective) free waits.
  std::string slot_error;
  try {
    for (int64_t s = 0; s < cache_.slots(); ++s) slot_mem_.push_back(device_.alloc(slot_bytes_));
  } catch (const std::exception& e) {
    for (void* p : slot_mem_) device_.free(p);
    slot_mem_.clear();
    slot_error = e.what();
  }
  int bad = slot_error.empty() ? 0 : 1, any_bad = 0;
  if (MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, comm) != MPI_SUCCESS)
    throw CommError("offload: the agreement on the device slots (MPI_Allreduce) failed");
  if (bad) throw ConfigError(slot_error);
  if (any_bad) throw ConfigError("offload: another rank could not allocate its device slots (its log says why)");
  slot_free_.resize(slot_mem_.size());
  version_.assign(units_.size(), kNoCopy);
  copied_.resize(units_.size());
  released_.assign(units_.size(), 0);
  expected_.assign(groups_.size(), 0);
  grad_fences_.resize(groups_.size());
  stats_.host_pinned_bytes = arena_->bytes();
  stats_.device_slot_bytes = slot_bytes_ * slot_mem_.size();
  const size_t threads = opts_.cpu_threads > 0 ? static_cast<size_t>(opts_.cpu_threads)
                                               : ThreadPool::default_threads(arena_->local_size());
  ThreadPool::configure(threads);
  if (opts_.async_step) worker_ = std::thread([this] { worker_loop(); });
  THETAD_LOG(info, "offload") << "parameter store: " << groups_.size() << " groups in "
                              << units_.size() << " units, " << slot_mem_.size() << " device slots of "
                              << mib(slot_bytes_) << " MiB on " << device_.name()
                              << ", host arena " << mib(arena_->bytes()) << " MiB, CPU Adam on "
                              << threads << " threads (" << adam_kernel_name() << ")";
}

ParamStore::~ParamStore() {
  if (worker_.joinable()) {
    {
      std::lock_guard<std::mutex> lk(q_mu_);
      q_stop_ = true;
    }
    q_cv_.notify_all();
    worker_.join();
  }
  // Copies into the slots, and out of the device into the arena, may still be in flight.
  copied_.push_back(last_d2h_);
  for (const Fence& f : copied_) {
    try {
      device_.host_wait(f);
    } catch (...) {
    }
  }
  for (void* p : slot_mem_) device_.free(p);
  // arena_ (collective MPI_Win_free) goes with the members.
}

std::vector<std::pair<size_t, size_t>> row_shards(size_t rows, size_t row_elems, size_t shard_bytes) {
  const size_t row_bytes = row_elems * sizeof(float);
  size_t per = rows;
  if (shard_bytes > 0 && rows * row_bytes > shard_bytes) per = std::max<size_t>(1, shard_bytes / row_bytes);
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t r = 0; r < rows; r += per) out.emplace_back(r, std::min(per, rows - r));
  return out;
}

size_t ParamStore::index_of(int group) const {
  auto it = index_.find(group);
  THETAD_CHECK(it != index_.end(), InternalError, "group ", group, " is not offloaded");
  return it->second;
}

const std::vector<int>& ParamStore::units_of(int group) const {
  return group_units_[index_of(group)];
}

const std::vector<int>& ParamStore::needed_at(int64_t step) {
  auto it = schedule_cache_.find(step);
  if (it != schedule_cache_.end()) return it->second;
  std::vector<int> groups;
  for (int g : schedule_(step)) {
    if (g == 0) continue;
    index_of(g);  // unknown ids are a bug in the caller's schedule
    groups.push_back(g);
  }
  return schedule_cache_.emplace(step, std::move(groups)).first->second;
}

int64_t ParamStore::next_use(int u) {
  const int g = units_[static_cast<size_t>(u)].group;
  const int64_t from = now_ < 0 ? 0 : now_;
  for (int64_t s = from; s <= from + kFutureHorizon; ++s) {
    if (s == now_ && released_[static_cast<size_t>(u)]) continue;  // done with it this step
    const auto& need = needed_at(s);
    if (std::find(need.begin(), need.end(), g) != need.end()) return s;
  }
  return SlotCache::kNever;
}

void ParamStore::begin_step(int64_t step) {
  if (step == now_) return;
  THETAD_CHECK(step > now_, InternalError, "offload: step ", step, " after step ", now_);
  now_ = step;
  std::fill(released_.begin(), released_.end(), 0);
  schedule_cache_.erase(schedule_cache_.begin(), schedule_cache_.lower_bound(step));
}

void ParamStore::copy_in(int u, int slot) {
  const UnitInfo& info = units_[static_cast<size_t>(u)];
  const size_t gi = index_of(info.group);
  const char* src = reinterpret_cast<const char*>(arena_->params(gi) + info.offset);
  char* dst = static_cast<char*>(slot_mem_[static_cast<size_t>(slot)]);
  const size_t bytes = info.numel * sizeof(float);
  // The arena is pinned in chunks; a copy that crossed a chunk boundary would not count as
  // pinned, so it is split there.
  const char* base = arena_->base();
  Fence last;
  for (size_t done = 0; done < bytes;) {
    const size_t pos = static_cast<size_t>(src + done - base);
    const size_t room = HostArena::kPinChunkBytes - pos % HostArena::kPinChunkBytes;
    const size_t len = std::min(bytes - done, room);
    last = device_.h2d(dst + done, src + done, len, slot_free_[static_cast<size_t>(slot)]);
    done += len;
  }
  copied_[static_cast<size_t>(u)] = last;
  version_[static_cast<size_t>(u)] = expected_[gi];
  std::lock_guard<std::mutex> lk(stats_mu_);
  stats_.h2d_bytes += bytes;
}

float* ParamStore::acquire(int u, int64_t step) {
  rethrow_worker_error();
  THETAD_CHECK(u >= 0 && u < num_units(), InternalError, "unit ", u, " out of range");
  begin_step(step);
  const UnitInfo& info = units_[static_cast<size_t>(u)];
  const size_t gi = index_of(info.group);
  // The owner's update of this group (maybe on another rank, maybe on our worker) must land.
  if (!arena_->seq_reached(gi, expected_[gi])) {
    const auto t0 = std::chrono::steady_clock::now();
    wait_update(gi);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lk(stats_mu_);
    stats_.acquire_wait_ms += ms;
  }
  const SlotCache::Result r = cache_.access(u, /*pin=*/true, [this](int64_t k) {
    return next_use(static_cast<int>(k));
  });
  pinned_.push_back(u);
  released_[static_cast<size_t>(u)] = 0;
  const bool fresh = r.hit && version_[static_cast<size_t>(u)] == expected_[gi];
  if (r.evicted) version_[static_cast<size_t>(*r.evicted)] = kNoCopy;
  if (!fresh) copy_in(u, r.slot);
  {
    std::lock_guard<std::mutex> lk(stats_mu_);
    (fresh ? stats_.swap_hits : stats_.swap_misses) += 1;
    if (r.evicted) stats_.evictions += 1;
  }
  device_.compute_wait(copied_[static_cast<size_t>(u)]);
  return static_cast<float*>(slot_mem_[static_cast<size_t>(r.slot)]);
}

void ParamStore::release(int u) {
  const auto slot = cache_.lookup(u);
  if (!slot) return;
  cache_.unpin(u);
  released_[static_cast<size_t>(u)] = 1;
  slot_free_[static_cast<size_t>(*slot)] = device_.record_compute();
}

void ParamStore::prefetch_for(int64_t step) {
  rethrow_worker_error();
  begin_step(step);
  const auto future = [this](int64_t k) { return next_use(static_cast<int>(k)); };
  for (int64_t s = step + 1; s <= step + opts_.prefetch; ++s) {
    const std::vector<int> groups = needed_at(s);  // copy: needed_at may rehash the cache
    for (int g : groups) {
      const size_t gi = index_of(g);
      // Values not final yet (an update is pending): acquire will copy them.
      if (!arena_->seq_reached(gi, expected_[gi])) continue;
      for (int u : group_units_[gi]) {
        const size_t uu = static_cast<size_t>(u);
        if (cache_.lookup(u) && version_[uu] == expected_[gi]) continue;
        if (cache_.pinned(u)) continue;  // in use by this step; acquire re-copies if stale
        const auto r = cache_.try_insert(u, s, future);
        if (!r) continue;  // every candidate slot holds something needed sooner
        if (r->evicted) version_[static_cast<size_t>(*r->evicted)] = kNoCopy;
        copy_in(u, r->slot);
        std::lock_guard<std::mutex> lk(stats_mu_);
        stats_.prefetches += 1;
        if (r->evicted) stats_.evictions += 1;
      }
    }
  }
}

void ParamStore::release_step(int64_t step) {
  rethrow_worker_error();
  begin_step(step);
  if (pinned_.empty()) return;
  const Fence done = device_.record_compute();
  for (int u : pinned_) {
    if (auto slot = cache_.lookup(u)) slot_free_[static_cast<size_t>(*slot)] = done;
  }
  pinned_.clear();
  cache_.unpin_all();
}

void ParamStore::push_grad(int u, const float* device_grad) {
  rethrow_worker_error();
  const UnitInfo& info = units_.at(static_cast<size_t>(u));
  const size_t gi = index_of(info.group);
  if (!arena_->is_owner(gi)) return;
  push(gi, info.offset, device_grad, info.numel, device_.record_compute());
}

void ParamStore::push_grad_range(int group, size_t offset, const float* device_grad, size_t numel) {
  rethrow_worker_error();
  const size_t gi = index_of(group);
  if (!arena_->is_owner(gi)) return;
  THETAD_CHECK(offset + numel <= arena_->entry(gi).numel, InternalError, "push_grad_range: [", offset, ", ",
               offset + numel, ") outside group ", group, " of ", arena_->entry(gi).numel, " elements");
  push(gi, offset, device_grad, numel, Fence{});
}

bool ParamStore::owns(int group) const { return arena_->is_owner(index_of(group)); }

void ParamStore::compute_after_pushes() {
  if (!last_push_.empty()) device_.compute_wait(last_push_);
  last_push_ = Fence{};
}

void ParamStore::push(size_t gi, size_t offset, const float* src, size_t numel, const Fence& after) {
  // Our worker may still be reading the landing area for the previous update.
  wait_update(gi);
  const size_t bytes = numel * sizeof(float);
  last_push_ = device_.d2h(arena_->grad(gi) + offset, src, bytes, after);
  last_d2h_ = last_push_;
  grad_fences_[gi].push_back(last_push_);
  std::lock_guard<std::mutex> lk(stats_mu_);
  stats_.d2h_bytes += bytes;
}

void ParamStore::discard_pushes(int group) {
  // Later copies of the group follow these on the one D2H stream: waiting for those covers them.
  grad_fences_[index_of(group)].clear();
}

void ParamStore::step_group(int group, const AdamHyper& hyper) {
  rethrow_worker_error();
  const size_t gi = index_of(group);
  expected_[gi] += 1;  // every device copy of the group is now stale (version_ < expected_)
  if (!arena_->is_owner(gi)) return;
  Job job{gi, hyper, std::move(grad_fences_[gi]), expected_[gi]};
  grad_fences_[gi].clear();
  if (!opts_.async_step) {
    run_job(job);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(q_mu_);
    queue_.push_back(std::move(job));
  }
  q_cv_.notify_one();
}

void ParamStore::run_job(Job& job) {
  for (const Fence& f : job.grads) device_.host_wait(f);
  const size_t gi = job.gi;
  const uint64_t before = arena_->seq(gi).load(std::memory_order_acquire);
  THETAD_CHECK_EQ(before + 1, job.target, "offload: group updates out of order");
  const auto t0 = std::chrono::steady_clock::now();
  AdamHyper h = job.hyper;
  if (h.clip_norm > 0) {  // the reduced gradient is here whole: clip by its norm
    const double norm = std::sqrt(sum_squares(arena_->grad(gi), arena_->entry(gi).numel));
    h.grad_scale = norm > h.clip_norm ? h.clip_norm / (norm + 1e-6) : 1.0;
  }
  adam_step(arena_->params(gi), arena_->grad(gi), arena_->exp_avg(gi), arena_->exp_avg_sq(gi),
            arena_->entry(gi).numel, h);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  arena_->publish(gi);
  std::lock_guard<std::mutex> lk(stats_mu_);
  stats_.cpu_adam_ms += ms;
  stats_.optimizer_steps += 1;
}

void ParamStore::worker_loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lk(q_mu_);
      q_cv_.wait(lk, [this] { return q_stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop requested and nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
      q_busy_ = true;
    }
    try {
      run_job(job);
    } catch (...) {
      std::lock_guard<std::mutex> lk(q_mu_);
      if (!worker_error_) worker_error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lk(q_mu_);
      q_busy_ = false;
    }
    q_idle_.notify_all();
  }
}

// Waits until the group's counted updates have landed; where this rank is the owner, a failure
// of its own optimizer thread ends the wait with that error (not with a timeout).
void ParamStore::wait_update(size_t gi) {
  const bool mine = arena_->is_owner(gi);
  arena_->wait_seq(gi, expected_[gi], opts_.timeout_s, [this, mine] {
    if (mine) rethrow_worker_error();
  });
}

void ParamStore::rethrow_worker_error() {
  std::lock_guard<std::mutex> lk(q_mu_);
  if (worker_error_) std::rethrow_exception(worker_error_);
}

void ParamStore::wait_idle() {
  if (worker_.joinable()) {
    std::unique_lock<std::mutex> lk(q_mu_);
    q_idle_.wait(lk, [this] { return (queue_.empty() && !q_busy_) || worker_error_; });
  }
  rethrow_worker_error();
}

// A node barrier with full fences on both sides: memory written before it on one rank of the
// host is seen after it on the others.
void ParamStore::fenced_node_barrier() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  arena_->node_barrier();
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

const float* ParamStore::group_params(int group) {
  rethrow_worker_error();
  const size_t gi = index_of(group);
  wait_update(gi);
  return arena_->params(gi);
}

void ParamStore::read_group(int group, float* params, float* exp_avg, float* exp_avg_sq) {
  rethrow_worker_error();
  const size_t gi = index_of(group);
  wait_update(gi);
  const size_t bytes = arena_->entry(gi).numel * sizeof(float);
  if (params) std::memcpy(params, arena_->params(gi), bytes);
  if (exp_avg) std::memcpy(exp_avg, arena_->exp_avg(gi), bytes);
  if (exp_avg_sq) std::memcpy(exp_avg_sq, arena_->exp_avg_sq(gi), bytes);
}

void ParamStore::init_all(const std::function<void(int group, float* dst)>& fill) {
  rethrow_worker_error();
  std::vector<size_t> mine;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    THETAD_CHECK(expected_[gi] == 0, InternalError, "init_all after group ", groups_[gi].group, " was updated");
    if (arena_->is_owner(gi)) mine.push_back(gi);
  }
  fenced_node_barrier();
  ThreadPool::instance().parallel_for(mine.size(), [&](size_t i) {
    const size_t gi = mine[i];
    const size_t bytes = arena_->entry(gi).numel * sizeof(float);
    fill(groups_[gi].group, arena_->params(gi));
    std::memset(arena_->exp_avg(gi), 0, bytes);
    std::memset(arena_->exp_avg_sq(gi), 0, bytes);
    std::memset(arena_->grad(gi), 0, bytes);
  });
  fenced_node_barrier();  // after it, the owners' writes are visible to the host's ranks
  for (size_t u = 0; u < version_.size(); ++u) version_[u] = kNoCopy;
}

void ParamStore::write_group(int group, const float* params, const float* exp_avg,
                             const float* exp_avg_sq) {
  THETAD_CHECK(params && exp_avg && exp_avg_sq, InternalError, "write_group(", group,
               ") needs params, exp_avg and exp_avg_sq");
  write_common(group, params, exp_avg, exp_avg_sq);
}

void ParamStore::write_common(int group, const float* params, const float* exp_avg,
                              const float* exp_avg_sq) {
  rethrow_worker_error();
  const size_t gi = index_of(group);
  wait_update(gi);
  // Nobody still reads the old values (copies in flight are waited for below).
  for (int u : group_units_[gi]) device_.host_wait(copied_[static_cast<size_t>(u)]);
  fenced_node_barrier();
  if (arena_->is_owner(gi)) {
    const size_t bytes = arena_->entry(gi).numel * sizeof(float);
    parallel_copy(arena_->params(gi), params, bytes);
    parallel_copy(arena_->exp_avg(gi), exp_avg, bytes);  // null: zeros
    parallel_copy(arena_->exp_avg_sq(gi), exp_avg_sq, bytes);
    parallel_copy(arena_->grad(gi), nullptr, bytes);
  }
  fenced_node_barrier();  // after it, the owner's writes are visible to the host's ranks
  for (int u : group_units_[gi]) version_[static_cast<size_t>(u)] = kNoCopy;
}

StoreStats ParamStore::stats() const {
  std::lock_guard<std::mutex> lk(stats_mu_);
  return stats_;
}

}  // namespace thetad::offload
