// The host-resident parameter store (see param_store.hpp): unit planning and slot sizing,
// acquire/prefetch over the slot cache, gradient landing and the owner's CPU optimizer step.
#include "offload/param_store.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "comm/control_plane.hpp"
#include "comm/mpi/mpi_communicator.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "offload/thread_pool.hpp"
#include "offload/util.hpp"

namespace thetad::offload {
namespace {

// How far ahead the schedule is read to rank eviction candidates; beyond it a unit's next use
// counts as unknown (LRU among those).
constexpr int64_t kFutureHorizon = 64;

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
                       Schedule groups_needed_at, MPI_Comm comm, Schedule groups_used_at)
    : opts_(opts), device_(device), schedule_(std::move(groups_needed_at)), cache_(1),
      used_schedule_(std::move(groups_used_at)), comm_(comm) {
  THETAD_CHECK(schedule_ != nullptr, InternalError, "ParamStore needs a schedule");
  THETAD_CHECK(opts_.prefetch >= 0, ConfigError, "offload.prefetch must be >= 0 (got ",
               opts_.prefetch, ")");
  plan_ = plan_store(groups, {opts_.shard_bytes, opts_.device_slots, opts_.device_budget_bytes});
  cache_ = SlotCache(plan_.slots);

  // Collective from here on; every rank reached it with the same decisions.
  held_.assign(plan_.index.size(), 0);
  for (const GroupShape& g : groups) held_[index_of(g.group)] = g.held ? 1 : 0;
  std::vector<ArenaEntry> entries;  // a group the job never uses takes no arena memory
  for (size_t gi = 0; gi < plan_.index.size(); ++gi)
    entries.push_back({plan_.index.group_of(gi), held_[gi] ? plan_.group_numel[gi] : 0});
  arena_ = std::make_unique<HostArena>(comm, entries, opts_.host_limit_bytes, &device_,
                                       timeout_of(opts_.timeout_s), opts_.bf16_copies);
  alloc_slots(comm);
  alloc_lines(comm);
  const size_t units = plan_.units.size();
  slot_free_.resize(slot_mem_.size());
  version_.assign(units, kNoCopy);
  copied_.resize(units);
  released_.assign(units, 0);
  expected_.assign(plan_.index.size(), 0);
  grad_fences_.resize(plan_.index.size());
  stats_.host_pinned_bytes = arena_->bytes();
  stats_.device_slot_bytes = plan_.slot_bytes * slot_mem_.size();
  cpu_threads_ = opts_.cpu_threads > 0 ? static_cast<size_t>(opts_.cpu_threads)
                                       : ThreadPool::default_threads(arena_->local_size());
  updates_ = std::make_unique<UpdateQueue>(*arena_, device_, opts_.async_step, opts_.timeout_s,
                                           opts_.lowest_group_first);
  THETAD_LOG(info, "offload") << "parameter store: " << plan_.index.size() << " groups in "
                              << units << " units, " << slot_mem_.size() << " device slots of "
                              << mib(plan_.slot_bytes) << " MiB on " << device_.name()
                              << (opts_.bf16_copies ? " (copied in as bf16)" : "")
                              << ", host arena " << mib(arena_->bytes()) << " MiB"
                              << held_groups_note() << ", CPU Adam on "
                              << cpu_threads_ << " threads (" << adam_kernel_name() << ")";
  log_cache("");
}

void ParamStore::size_cache(size_t bytes) {
  THETAD_CHECK(line_mem_.empty() && opts_.cache_bytes == 0, InternalError,
               "offload: size_cache on a store whose device cache is already sized");
  opts_.cache_bytes = bytes;
  alloc_lines(comm_);
  log_cache(" (sized after the first step)");
}

void ParamStore::log_cache(const char* when) const {
  if (line_mem_.empty()) return;
  THETAD_LOG(info, "offload") << "device cache" << when << ": " << line_mem_.size() << " lines of "
                              << mib(3 * line_numel_ * sizeof(float)) << " MiB (a group with its Adam state; "
                              << mib(stats_.cache_line_bytes)
                              << " MiB): cached groups are updated on the device, the others by their owner's CPU AdamW";
  if (lines_.transit_lines() > 0) {
    THETAD_LOG(info, "offload") << "device cache: " << lines_.transit_lines() << " of its lines are transit lines "
                                << "(offload.uncached_update: "
                                << (opts_.uncached_update == UncachedUpdate::Device ? "device" : "auto")
                                << "): a group the cache does not keep "
                                << (opts_.uncached_update == UncachedUpdate::Device
                                        ? "is streamed through one"
                                        : "is streamed through one where the measured bandwidths favour it")
                                << ", with its Adam state, and updated on the device";
  }
}

// Every rank learns whether all got their device slots: a rank failing alone would otherwise
// leave the others waiting in the next collective while its arena's (collective) free waits.
void ParamStore::alloc_slots(MPI_Comm comm) {
  std::exception_ptr error;
  try {
    for (int64_t s = 0; s < cache_.slots(); ++s) {
      slot_mem_.push_back(device_.alloc(plan_.slot_bytes));
      if (opts_.bf16_copies) slot_stage_.push_back(device_.alloc(plan_.slot_bytes / 2 + sizeof(uint16_t)));
    }
  } catch (...) {
    for (void* p : slot_mem_) device_.free(p);
    for (void* p : slot_stage_) device_.free(p);
    slot_mem_.clear();
    slot_stage_.clear();
    error = std::current_exception();
  }
  comm::ControlPlane plane(std::make_shared<comm::MpiCommunicator>(comm), timeout_of(opts_.timeout_s));
  plane.agree(error, {"offload: the agreement on the device slots"});
}

ParamStore::~ParamStore() {
  // What is queued runs anyway (the queue's destructor); waiting here first lets the count
  // below include it. Tests add the counts up per node: each group is stepped once per node
  // per step it was used.
  try {
    updates_->wait_idle();
  } catch (...) {  // the error has been reported where it happened
  }
  THETAD_LOG(info, "offload") << "parameter store: " << updates_->steps()
                              << " group steps run as owner (node-local rank "
                              << arena_->local_rank() << " of " << arena_->local_size() << ")";
  if (!line_mem_.empty()) {
    THETAD_LOG(info, "offload") << "device cache: " << stats_.cache_loads << " loads, " << stats_.cache_flushes
                                << " flushes by this rank, " << stats_.device_steps << " group steps on the device ("
                                << stats_.streamed_steps << " of them streamed through transit lines)";
  }
  updates_.reset();  // stops the owner's optimizer thread
  // Copies into the slots, and out of the device into the arena, may still be in flight.
  copied_.push_back(last_d2h_);
  for (const Fence& f : copied_) {
    try {
      device_.host_wait(f);
    } catch (...) {
    }
  }
  for (const Fence& f : line_loaded_) {
    try {
      device_.host_wait(f);
    } catch (...) {
    }
  }
  for (const Fence& f : line_free_) {
    try {
      device_.host_wait(f);
    } catch (...) {
    }
  }
  for (void* p : slot_mem_) device_.free(p);
  for (void* p : slot_stage_) device_.free(p);
  for (void* p : line_mem_) device_.free(p);
  // arena_ (collective MPI_Win_free) goes with the members.
}

const std::vector<int>& ParamStore::units_of(int group) const {
  return plan_.group_units[index_of(group)];
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
  const int g = plan_.units[static_cast<size_t>(u)].group;
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
  used_cache_.erase(used_cache_.begin(), used_cache_.lower_bound(step));
}

// One copy between the device and the arena, split where the arena's pinned chunks end (a copy
// across a chunk boundary would not count as pinned). Returns the last part's completion.
Fence ParamStore::copy_split(bool to_device, char* dst, const char* src, size_t bytes, const Fence& after) {
  const char* host = to_device ? src : dst;
  const char* base = arena_->base();
  Fence last;
  for (size_t done = 0; done < bytes;) {
    const size_t pos = static_cast<size_t>(host + done - base);
    const size_t room = HostArena::kPinChunkBytes - pos % HostArena::kPinChunkBytes;
    const size_t len = std::min(bytes - done, room);
    last = to_device ? device_.h2d(dst + done, src + done, len, after) : device_.d2h(dst + done, src + done, len, after);
    done += len;
  }
  return last;
}

void ParamStore::copy_in(int u, int slot) {
  const UnitInfo& info = plan_.units[static_cast<size_t>(u)];
  const size_t gi = held_index(info.group);
  const size_t s = static_cast<size_t>(slot);
  size_t bytes = info.numel * sizeof(float);
  if (opts_.bf16_copies) {  // the bf16 copy into the slot's staging buffer, widened after it
    bytes = info.numel * sizeof(uint16_t);
    const char* src = reinterpret_cast<const char*>(arena_->params_bf16(gi) + info.offset);
    auto* stage = static_cast<uint16_t*>(slot_stage_[s]);
    const Fence landed = copy_split(true, reinterpret_cast<char*>(stage), src, bytes, slot_free_[s]);
    copied_[static_cast<size_t>(u)] = device_.widen_bf16(static_cast<float*>(slot_mem_[s]), stage, info.numel, landed);
  } else {
    const char* src = reinterpret_cast<const char*>(arena_->params(gi) + info.offset);
    copied_[static_cast<size_t>(u)] = copy_split(true, static_cast<char*>(slot_mem_[s]), src, bytes, slot_free_[s]);
  }
  version_[static_cast<size_t>(u)] = expected_[gi];
  std::lock_guard<std::mutex> lk(stats_mu_);
  stats_.h2d_bytes += bytes;
}

// The owner's update of the group (maybe on another rank, maybe on our worker) must land before
// its values are copied to the device; the time blocked counts as acquire_wait_ms.
void ParamStore::wait_final(size_t gi) {
  if (arena_->seq_reached(gi, expected_[gi])) return;
  const auto t0 = std::chrono::steady_clock::now();
  updates_->wait_update(gi, expected_[gi]);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lk(stats_mu_);
  stats_.acquire_wait_ms += ms;
}

float* ParamStore::acquire(int u, int64_t step, bool order_compute) {
  updates_->rethrow_error();
  THETAD_CHECK(u >= 0 && u < num_units(), InternalError, "unit ", u, " out of range");
  begin_step(step);
  const UnitInfo& info = plan_.units[static_cast<size_t>(u)];
  const size_t gi = index_of(info.group);
  THETAD_CHECK(!lines_.cached(gi), InternalError, "offload: acquire of group ", info.group, ", which is in the device cache");
  wait_final(gi);
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
  if (order_compute) device_.compute_wait(copied_[static_cast<size_t>(u)]);
  return static_cast<float*>(slot_mem_[static_cast<size_t>(r.slot)]);
}

void ParamStore::order_compute(int u) { device_.compute_wait(copied_.at(static_cast<size_t>(u))); }

void ParamStore::release(int u) {
  const auto slot = cache_.lookup(u);
  if (!slot) return;
  cache_.unpin(u);
  released_[static_cast<size_t>(u)] = 1;
  slot_free_[static_cast<size_t>(*slot)] = device_.record_compute();
}

void ParamStore::prefetch_for(int64_t step) {
  updates_->rethrow_error();
  begin_step(step);
  if (lines_.lines() > 0 && opts_.prefetch > 0) {  // next step's groups into free cache lines
    const std::vector<size_t> busy = used_at(step);  // a copy: used_at may rehash its cache
    const auto need = [this](int64_t s) -> const std::vector<size_t>& { return used_at(s); };
    for (const auto& [gi, line] : lines_.claim_free(step + 1, need, busy)) {
      load_line(gi, line, LineWait::next_step);
    }
  }
  const auto future = [this](int64_t k) { return next_use(static_cast<int>(k)); };
  for (int64_t s = step + 1; s <= step + opts_.prefetch; ++s) {
    const std::vector<int> groups = needed_at(s);  // copy: needed_at may rehash the cache
    for (int g : groups) {
      const size_t gi = index_of(g);
      if (lines_.cached(gi)) continue;  // updated in place on the device
      // Values not final yet (an update is pending): acquire will copy them.
      if (!arena_->seq_reached(gi, expected_[gi])) continue;
      for (int u : plan_.group_units[gi]) {
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
  updates_->rethrow_error();
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
  updates_->rethrow_error();
  const UnitInfo& info = plan_.units.at(static_cast<size_t>(u));
  const size_t gi = index_of(info.group);
  if (!arena_->is_owner(gi)) return;
  push(gi, info.offset, device_grad, info.numel, device_.record_compute());
}

void ParamStore::push_grad_range(int group, size_t offset, const float* device_grad, size_t numel) {
  updates_->rethrow_error();
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
  updates_->wait_update(gi, expected_[gi]);
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
  updates_->rethrow_error();
  const size_t gi = held_index(group);
  expected_[gi] += 1;  // every device copy of the group is now stale (version_ < expected_)
  if (lines_.cached(gi)) {  // the caller updated its line on the device
    grad_fences_[gi].clear();
    std::lock_guard<std::mutex> lk(stats_mu_);
    stats_.device_steps += 1;
    stats_.streamed_steps += lines_.in_transit(gi) ? 1 : 0;
    return;
  }
  if (!arena_->is_owner(gi)) return;
  std::vector<Fence> grads = std::move(grad_fences_[gi]);
  grad_fences_[gi].clear();
  updates_->submit(gi, hyper, std::move(grads), expected_[gi]);
}

void ParamStore::wait_idle() { updates_->wait_idle(); }

const float* ParamStore::group_params(int group) {
  updates_->rethrow_error();
  const size_t gi = held_index(group);
  if (lines_.cached(gi)) {  // a private copy of the line's values (the arena's are older)
    // Kept for the next call while the group is not updated: the hash reads a group parameter by
    // parameter (a LoRA adapter has 128), and each read copied the whole line again.
    if (scratch_entry_ != gi || scratch_version_ != expected_[gi]) {
      scratch_.resize(arena_->entry(gi).numel);
      read_group(group, scratch_.data(), nullptr, nullptr);
      scratch_entry_ = gi;
      scratch_version_ = expected_[gi];
    }
    return scratch_.data();
  }
  updates_->wait_update(gi, expected_[gi]);
  return arena_->params(gi);
}

void ParamStore::read_group(int group, float* params, float* exp_avg, float* exp_avg_sq) {
  updates_->rethrow_error();
  const size_t gi = held_index(group);
  const size_t bytes = arena_->entry(gi).numel * sizeof(float);
  if (lines_.cached(gi)) {  // after the compute queued so far (its last device update)
    wait_early_load(lines_.line(gi));
    const Fence after = device_.record_compute();
    float* dst[3] = {params, exp_avg, exp_avg_sq};
    for (int k = 0; k < 3; ++k)
      if (dst[k]) device_.host_wait(device_.d2h(dst[k], line_part(group, k), bytes, after));
    return;
  }
  updates_->wait_update(gi, expected_[gi]);
  if (params) std::memcpy(params, arena_->params(gi), bytes);
  if (exp_avg) std::memcpy(exp_avg, arena_->exp_avg(gi), bytes);
  if (exp_avg_sq) std::memcpy(exp_avg_sq, arena_->exp_avg_sq(gi), bytes);
}

void ParamStore::init_all(const std::function<void(int group, float* dst)>& fill) {
  updates_->rethrow_error();
  std::vector<size_t> mine;
  for (size_t gi = 0; gi < plan_.index.size(); ++gi) {
    THETAD_CHECK(expected_[gi] == 0, InternalError, "init_all after group ", plan_.index.group_of(gi), " was updated");
    if (held_[gi] && arena_->is_owner(gi)) mine.push_back(gi);
  }
  arena_->node_barrier("init_all: start");
  ThreadPool::instance().parallel_for(mine.size(), [&](size_t i) {
    const size_t gi = mine[i];
    const size_t bytes = arena_->entry(gi).numel * sizeof(float);
    fill(plan_.index.group_of(gi), arena_->params(gi));
    std::memset(arena_->exp_avg(gi), 0, bytes);
    std::memset(arena_->exp_avg_sq(gi), 0, bytes);
    std::memset(arena_->grad(gi), 0, bytes);
  });
  for (size_t gi : mine) arena_->refresh_bf16(gi);  // on the pool itself, not from inside its tasks
  arena_->node_barrier("init_all: the owners' initial values");  // visible to the host's ranks after it
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
  updates_->rethrow_error();
  const size_t gi = held_index(group);
  scratch_entry_ = SIZE_MAX;  // its values change without an update
  // A cached group's line is replaced by the arena's new values: it leaves the cache, every rank
  // alike (the arena's sequence number is behind its device updates: the owner catches it up).
  const bool was_cached = lines_.cached(gi);
  if (was_cached) {
    wait_early_load(lines_.line(gi));
    line_free_[static_cast<size_t>(lines_.line(gi))] = device_.record_compute();
    lines_.drop(gi);
  } else {
    updates_->wait_update(gi, expected_[gi]);
  }
  // Nobody still reads the old values (copies in flight are waited for below).
  for (int u : plan_.group_units[gi]) device_.host_wait(copied_[static_cast<size_t>(u)]);
  arena_->node_barrier("write_group: start");
  if (arena_->is_owner(gi)) {
    const size_t bytes = arena_->entry(gi).numel * sizeof(float);
    parallel_copy(arena_->params(gi), params, bytes);
    arena_->refresh_bf16(gi);
    parallel_copy(arena_->exp_avg(gi), exp_avg, bytes);  // null: zeros
    parallel_copy(arena_->exp_avg_sq(gi), exp_avg_sq, bytes);
    parallel_copy(arena_->grad(gi), nullptr, bytes);
    while (was_cached && !arena_->seq_reached(gi, expected_[gi])) arena_->publish(gi);
  }
  arena_->node_barrier("write_group: the owner's values");  // visible to the host's ranks after it
  for (int u : plan_.group_units[gi]) version_[static_cast<size_t>(u)] = kNoCopy;
}

size_t ParamStore::held_index(int group) const {
  const size_t gi = index_of(group);
  THETAD_CHECK(held_[gi], InternalError, "offload: group ", group,
               " has no memory in the host arena (offload.host_groups: scheduled, and the schedule never uses it); "
               "its values are the initial ones, drawn by the caller");
  return gi;
}

std::string ParamStore::held_groups_note() const {
  const size_t held = static_cast<size_t>(std::count(held_.begin(), held_.end(), uint8_t{1}));
  if (held == held_.size()) return "";
  return ::thetad::detail::concat(" holding ", held, " of ", held_.size(),
                                  " groups (the others are never used by this job: offload.host_groups: scheduled)");
}

StoreStats ParamStore::stats() const {
  StoreStats s;
  {
    std::lock_guard<std::mutex> lk(stats_mu_);
    s = stats_;
  }
  s.cpu_adam_ms = updates_->cpu_adam_ms();
  s.optimizer_steps = updates_->steps();
  return s;
}

}  // namespace thetad::offload
