// The host-resident parameter store (see param_store.hpp): the device slots, acquire/prefetch
// over the slot cache, gradient landing, the owner's CPU optimizer step, checkpoint reads and writes.
#include "offload/param_store.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "comm/node_memory.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/thread_pool.hpp"
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
                       Schedule groups_needed_at, Schedule groups_used_at)
    : core_(opts, groups, device), schedule_(std::move(groups_needed_at)), slots_(core_.plan.slots) {
  THETAD_CHECK(schedule_ != nullptr, InternalError, "ParamStore needs a schedule");
  try {
    alloc_slots();
    alloc_update_lines();
    lines_ = std::make_unique<CacheLines>(core_, std::move(groups_used_at));
  } catch (const CommError&) {
    // A rank that never came to an agreement (TimeoutError) or failed in it: the job is on its
    // way out (exit 3), and the arena's collective free would wait for that rank forever.
    free_slots();
    update_lines_.reset();
    comm::abandon_node_memory();
    throw;
  } catch (...) {  // no destructor runs
    free_slots();
    update_lines_.reset();
    throw;
  }
  const size_t units = core_.plan.units.size();
  slot_free_.resize(slot_mem_.size());
  version_.assign(units, kNoCopy);
  copied_.resize(units);
  released_.assign(units, 0);
  grad_fences_.resize(core_.plan.index.size());
  core_.stats.device_slot_bytes = core_.plan.slot_bytes * slot_mem_.size();
  cpu_threads_ = cpu_adam_threads(core_.opts.cpu_threads, core_.arena->local_size());
  THETAD_LOG(info, "offload") << "parameter store: " << core_.plan.index.size() << " groups in " << units
                              << " units, " << slot_mem_.size() << " device slots of " << mib(core_.plan.slot_bytes)
                              << " MiB on " << core_.device.name()
                              << (core_.opts.bf16_copies ? " (copied in as bf16)" : "") << ", host arena "
                              << mib(core_.arena->bytes()) << " MiB" << held_groups_note() << ", CPU Adam on "
                              << cpu_threads_ << " threads (" << adam_kernel_name() << ")";
  lines_->log("");
}

// Every rank learns whether all got their device slots: a rank failing alone would otherwise
// leave the others waiting in the next collective while its arena's (collective) free waits.
void ParamStore::alloc_slots() {
  std::exception_ptr error;
  try {
    for (int64_t s = 0; s < slots_.slots(); ++s) {
      slot_mem_.push_back(core_.device.alloc(core_.plan.slot_bytes));
      if (core_.opts.bf16_copies)
        slot_stage_.push_back(core_.device.alloc(core_.plan.slot_bytes / 2 + sizeof(uint16_t)));
    }
  } catch (...) {
    free_slots();
    error = std::current_exception();
  }
  core_.plane.agree(error, {"offload: the agreement on the device slots"});
}

// Like the slots: every rank learns whether all got their update lines.
void ParamStore::alloc_update_lines() {
  if (core_.opts.update_lines <= 0) return;
  size_t numel = 0;
  for (size_t gi = 0; gi < core_.plan.index.size(); ++gi)
    if (core_.held[gi]) numel = std::max(numel, core_.plan.group_numel[gi]);
  std::exception_ptr error;
  try {
    update_lines_ = std::make_unique<UpdateLines>(core_, core_.opts.update_lines, numel);
  } catch (...) {
    error = std::current_exception();
  }
  core_.plane.agree(error, {"offload: the agreement on the update lines"});
  if (!update_lines_) return;
  THETAD_LOG(info, "offload") << "parameter store: " << update_lines_->lines() << " update lines of "
                              << mib(update_lines_->bytes() / static_cast<size_t>(update_lines_->lines()))
                              << " MiB (a group with its Adam state, updated on the device within a step)";
}

float* ParamStore::load_for_update(int group, bool order_compute) {
  core_.updates->rethrow_error();
  THETAD_CHECK(update_lines_, InternalError, "offload: load_for_update on a store without update lines");
  return update_lines_->load(core_.held_index(group), order_compute);
}

void ParamStore::order_update(int group) { update_lines_->order(core_.held_index(group)); }

void ParamStore::updated_on_device(int group) {
  core_.updates->rethrow_error();
  const size_t gi = core_.held_index(group);
  core_.expected[gi] += 1;  // every device copy of the group is now stale; the flush publishes this update
  update_lines_->flush(gi);
}

void ParamStore::drop_update_lines() {
  if (!update_lines_) return;
  THETAD_CHECK(update_lines_->free_lines() == update_lines_->lines(), InternalError,
               "offload: update lines dropped while a group is loaded in one");
  const size_t bytes = update_lines_->bytes();
  update_lines_.reset();  // waits for the probe's copies
  THETAD_LOG(info, "offload") << "parameter store: update lines freed (" << mib(bytes) << " MiB)";
}

UpdateBandwidths ParamStore::update_bandwidths() {
  THETAD_CHECK(update_lines_, InternalError, "offload: update_bandwidths on a store without update lines");
  return core_.agreed_bandwidths(update_lines_->scratch(), update_lines_->line_numel(),
                                 "offload: the agreement on the measured bandwidths (the trunk's split)");
}

void ParamStore::free_slots() noexcept {
  for (void* p : slot_mem_) core_.device.free(p);
  for (void* p : slot_stage_) core_.device.free(p);
  slot_mem_.clear();
  slot_stage_.clear();
}

ParamStore::~ParamStore() {
  // What is queued runs anyway (the queue's destructor); waiting here first lets the count
  // below include it. Tests add the counts up per node: each group is stepped once per node
  // per step it was used.
  try {
    core_.updates->wait_idle();
  } catch (...) {  // the error has been reported where it happened
  }
  THETAD_LOG(info, "offload") << "parameter store: " << core_.updates->steps()
                              << " group steps run as owner (node-local rank "
                              << core_.arena->local_rank() << " of " << core_.arena->local_size() << ")";
  if (lines_ && lines_->cache_lines() > 0) {
    const StoreStats& st = core_.stats;
    THETAD_LOG(info, "offload") << "device cache: " << st.cache_loads << " loads, " << st.cache_flushes
                                << " flushes by this rank, " << st.device_steps << " group steps on the device ("
                                << st.streamed_steps << " of them streamed through transit lines)";
  }
  core_.updates.reset();  // stops the owner's optimizer thread
  // Copies into the slots, and out of the device into the arena, may still be in flight.
  copied_.push_back(core_.last_d2h);
  for (const Fence& f : copied_) {
    try {
      core_.device.host_wait(f);
    } catch (...) {
    }
  }
  lines_.reset();  // waits for the lines' copies
  update_lines_.reset();
  free_slots();
  // core_'s arena (the collective free of the node's memory) goes with the members.
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
  const int g = core_.plan.units[static_cast<size_t>(u)].group;
  const int64_t from = core_.now < 0 ? 0 : core_.now;
  for (int64_t s = from; s <= from + kFutureHorizon; ++s) {
    if (s == core_.now && released_[static_cast<size_t>(u)]) continue;  // done with it this step
    const auto& need = needed_at(s);
    if (std::find(need.begin(), need.end(), g) != need.end()) return s;
  }
  return SlotCache::kNever;
}

void ParamStore::begin_step(int64_t step) {
  if (step == core_.now) return;
  THETAD_CHECK(step > core_.now, InternalError, "offload: step ", step, " after step ", core_.now);
  core_.now = step;
  std::fill(released_.begin(), released_.end(), 0);
  schedule_cache_.erase(schedule_cache_.begin(), schedule_cache_.lower_bound(step));
  lines_->forget_before(step);
}

void ParamStore::copy_in(int u, int slot) {
  const UnitInfo& info = core_.plan.units[static_cast<size_t>(u)];
  const size_t gi = core_.held_index(info.group);
  const size_t s = static_cast<size_t>(slot);
  size_t bytes = info.numel * sizeof(float);
  if (core_.opts.bf16_copies) {  // the bf16 copy into the slot's staging buffer, widened after it
    bytes = info.numel * sizeof(uint16_t);
    const char* src = reinterpret_cast<const char*>(core_.arena->params_bf16(gi) + info.offset);
    auto* stage = static_cast<uint16_t*>(slot_stage_[s]);
    const Fence landed = core_.copy_split(true, reinterpret_cast<char*>(stage), src, bytes, slot_free_[s]);
    copied_[static_cast<size_t>(u)] = core_.device.widen_bf16(static_cast<float*>(slot_mem_[s]), stage, info.numel, landed);
  } else {
    const char* src = reinterpret_cast<const char*>(core_.arena->params(gi) + info.offset);
    copied_[static_cast<size_t>(u)] = core_.copy_split(true, static_cast<char*>(slot_mem_[s]), src, bytes, slot_free_[s]);
  }
  version_[static_cast<size_t>(u)] = core_.expected[gi];
  core_.count([&](StoreStats& st) { st.h2d_bytes += bytes; });
}

void ParamStore::place(int64_t step) {
  core_.updates->rethrow_error();
  begin_step(step);
  lines_->place(step);
}

float* ParamStore::acquire(int u, int64_t step, bool order_compute) {
  core_.updates->rethrow_error();
  THETAD_CHECK(u >= 0 && u < core_.plan.num_units(), InternalError, "unit ", u, " out of range");
  begin_step(step);
  const UnitInfo& info = core_.plan.units[static_cast<size_t>(u)];
  const size_t gi = index_of(info.group);
  THETAD_CHECK(!lines_->policy().cached(gi), InternalError, "offload: acquire of group ", info.group, ", which is in the device cache");
  core_.wait_final(gi);
  const SlotCache::Result r = slots_.access(u, /*pin=*/true, [this](int64_t k) {
    return next_use(static_cast<int>(k));
  });
  pinned_.push_back(u);
  released_[static_cast<size_t>(u)] = 0;
  const bool fresh = r.hit && version_[static_cast<size_t>(u)] == core_.expected[gi];
  if (r.evicted) version_[static_cast<size_t>(*r.evicted)] = kNoCopy;
  if (!fresh) copy_in(u, r.slot);
  core_.count([&](StoreStats& st) {
    (fresh ? st.swap_hits : st.swap_misses) += 1;
    if (r.evicted) st.evictions += 1;
  });
  if (order_compute) core_.device.compute_wait(copied_[static_cast<size_t>(u)]);
  return static_cast<float*>(slot_mem_[static_cast<size_t>(r.slot)]);
}

void ParamStore::order_compute(int u) { core_.device.compute_wait(copied_.at(static_cast<size_t>(u))); }

void ParamStore::release(int u) {
  const auto slot = slots_.lookup(u);
  if (!slot) return;
  slots_.unpin(u);
  released_[static_cast<size_t>(u)] = 1;
  slot_free_[static_cast<size_t>(*slot)] = core_.device.record_compute();
}

void ParamStore::prefetch_for(int64_t step) {
  core_.updates->rethrow_error();
  begin_step(step);
  lines_->prefetch(step);  // next step's groups into free cache lines
  const auto future = [this](int64_t k) { return next_use(static_cast<int>(k)); };
  for (int64_t s = step + 1; s <= step + core_.opts.prefetch; ++s) {
    const std::vector<int> groups = needed_at(s);  // copy: needed_at may rehash the cache
    for (int g : groups) {
      const size_t gi = index_of(g);
      if (lines_->policy().cached(gi)) continue;  // updated in place on the device
      // Values not final yet (an update is pending): acquire will copy them.
      if (!core_.arena->seq_reached(gi, core_.expected[gi])) continue;
      for (int u : core_.plan.group_units[gi]) {
        const size_t uu = static_cast<size_t>(u);
        if (slots_.lookup(u) && version_[uu] == core_.expected[gi]) continue;
        if (slots_.pinned(u)) continue;  // in use by this step; acquire re-copies if stale
        const auto r = slots_.try_insert(u, s, future);
        if (!r) continue;  // every candidate slot holds something needed sooner
        if (r->evicted) version_[static_cast<size_t>(*r->evicted)] = kNoCopy;
        copy_in(u, r->slot);
        core_.count([&](StoreStats& st) {
          st.prefetches += 1;
          if (r->evicted) st.evictions += 1;
        });
      }
    }
  }
}

void ParamStore::release_step(int64_t step) {
  core_.updates->rethrow_error();
  begin_step(step);
  if (update_lines_) update_lines_->release_all();
  if (pinned_.empty()) return;
  const Fence done = core_.device.record_compute();
  for (int u : pinned_) {
    if (auto slot = slots_.lookup(u)) slot_free_[static_cast<size_t>(*slot)] = done;
  }
  pinned_.clear();
  slots_.unpin_all();
}

void ParamStore::push_grad(int u, const float* device_grad) {
  core_.updates->rethrow_error();
  const UnitInfo& info = core_.plan.units.at(static_cast<size_t>(u));
  const size_t gi = index_of(info.group);
  if (!core_.arena->is_owner(gi)) return;
  push(gi, info.offset, device_grad, info.numel, core_.device.record_compute());
}

void ParamStore::push_grad_range(int group, size_t offset, const float* device_grad, size_t numel) {
  core_.updates->rethrow_error();
  const size_t gi = index_of(group);
  if (!core_.arena->is_owner(gi)) return;
  THETAD_CHECK(offset + numel <= core_.arena->entry(gi).numel, InternalError, "push_grad_range: [", offset, ", ",
               offset + numel, ") outside group ", group, " of ", core_.arena->entry(gi).numel, " elements");
  push(gi, offset, device_grad, numel, Fence{});
}

bool ParamStore::owns(int group) const { return core_.arena->is_owner(index_of(group)); }

void ParamStore::compute_after_pushes() {
  if (!last_push_.empty()) core_.device.compute_wait(last_push_);
  last_push_ = Fence{};
}

void ParamStore::push(size_t gi, size_t offset, const float* src, size_t numel, const Fence& after) {
  // Our worker may still be reading the landing area for the previous update.
  core_.updates->wait_update(gi, core_.expected[gi]);
  const size_t bytes = numel * sizeof(float);
  last_push_ = core_.device.d2h(core_.arena->grad(gi) + offset, src, bytes, after);
  core_.last_d2h = last_push_;
  grad_fences_[gi].push_back(last_push_);
  core_.count([&](StoreStats& st) { st.d2h_bytes += bytes; });
}

void ParamStore::discard_pushes(int group) {
  // Later copies of the group follow these on the one D2H stream: waiting for those covers them.
  grad_fences_[index_of(group)].clear();
}

void ParamStore::step_group(int group, const AdamHyper& hyper) {
  core_.updates->rethrow_error();
  const size_t gi = core_.held_index(group);
  core_.expected[gi] += 1;  // every device copy of the group is now stale (version_ < expected_)
  if (lines_->policy().cached(gi)) {  // the caller updated its line on the device
    grad_fences_[gi].clear();
    const bool streamed = lines_->policy().in_transit(gi);
    core_.count([&](StoreStats& st) {
      st.device_steps += 1;
      st.streamed_steps += streamed ? 1 : 0;
    });
    return;
  }
  if (!core_.arena->is_owner(gi)) return;
  std::vector<Fence> grads = std::move(grad_fences_[gi]);
  grad_fences_[gi].clear();
  core_.updates->submit(gi, hyper, std::move(grads), core_.expected[gi]);
}

void ParamStore::wait_idle() { core_.updates->wait_idle(); }

const float* ParamStore::group_params(int group) {
  core_.updates->rethrow_error();
  const size_t gi = core_.held_index(group);
  if (lines_->policy().cached(gi)) {  // a private copy of the line's values (the arena's are older)
    // Kept for the next call while the group is not updated: the hash reads a group parameter by
    // parameter (a LoRA adapter has 128), and each read copied the whole line again.
    if (scratch_entry_ != gi || scratch_version_ != core_.expected[gi]) {
      scratch_.resize(core_.arena->entry(gi).numel);
      read_group(group, scratch_.data(), nullptr, nullptr);
      scratch_entry_ = gi;
      scratch_version_ = core_.expected[gi];
    }
    return scratch_.data();
  }
  core_.updates->wait_update(gi, core_.expected[gi]);
  return core_.arena->params(gi);
}

void ParamStore::read_group(int group, float* params, float* exp_avg, float* exp_avg_sq) {
  core_.updates->rethrow_error();
  const size_t gi = core_.held_index(group);
  const size_t bytes = core_.arena->entry(gi).numel * sizeof(float);
  if (lines_->policy().cached(gi)) {  // after the compute queued so far (its last device update)
    lines_->read(gi, params, exp_avg, exp_avg_sq);
    return;
  }
  core_.updates->wait_update(gi, core_.expected[gi]);
  if (params) std::memcpy(params, core_.arena->params(gi), bytes);
  if (exp_avg) std::memcpy(exp_avg, core_.arena->exp_avg(gi), bytes);
  if (exp_avg_sq) std::memcpy(exp_avg_sq, core_.arena->exp_avg_sq(gi), bytes);
}

void ParamStore::init_all(const std::function<void(int group, float* dst)>& fill) {
  core_.updates->rethrow_error();
  std::vector<size_t> mine;
  for (size_t gi = 0; gi < core_.plan.index.size(); ++gi) {
    THETAD_CHECK(core_.expected[gi] == 0, InternalError, "init_all after group ", core_.plan.index.group_of(gi), " was updated");
    if (core_.held[gi] && core_.arena->is_owner(gi)) mine.push_back(gi);
  }
  core_.arena->node_barrier("init_all: start");
  ThreadPool::instance().parallel_for(mine.size(), [&](size_t i) {
    const size_t gi = mine[i];
    const size_t bytes = core_.arena->entry(gi).numel * sizeof(float);
    fill(core_.plan.index.group_of(gi), core_.arena->params(gi));
    std::memset(core_.arena->exp_avg(gi), 0, bytes);
    std::memset(core_.arena->exp_avg_sq(gi), 0, bytes);
    std::memset(core_.arena->grad(gi), 0, bytes);
  });
  for (size_t gi : mine) core_.arena->refresh_bf16(gi);  // on the pool itself, not from inside its tasks
  core_.arena->node_barrier("init_all: the owners' initial values");  // visible to the host's ranks after it
  for (size_t u = 0; u < version_.size(); ++u) version_[u] = kNoCopy;
}

void ParamStore::write_group(int group, const float* params, const float* exp_avg,
                             const float* exp_avg_sq) {
  THETAD_CHECK(params && exp_avg && exp_avg_sq, InternalError, "write_group(", group,
               ") needs params, exp_avg and exp_avg_sq");
  core_.updates->rethrow_error();
  const size_t gi = core_.held_index(group);
  scratch_entry_ = SIZE_MAX;  // its values change without an update
  // A cached group's line is replaced by the arena's new values: it leaves the cache, every rank
  // alike (the arena's sequence number is behind its device updates: the owner catches it up).
  const bool was_cached = lines_->policy().cached(gi);
  if (was_cached) {
    lines_->drop(gi);
  } else {
    core_.updates->wait_update(gi, core_.expected[gi]);
  }
  // Nobody still reads the old values (copies in flight are waited for below).
  for (int u : core_.plan.group_units[gi]) core_.device.host_wait(copied_[static_cast<size_t>(u)]);
  core_.arena->node_barrier("write_group: start");
  if (core_.arena->is_owner(gi)) {
    const size_t bytes = core_.arena->entry(gi).numel * sizeof(float);
    parallel_copy(core_.arena->params(gi), params, bytes);
    core_.arena->refresh_bf16(gi);
    parallel_copy(core_.arena->exp_avg(gi), exp_avg, bytes);  // null: zeros
    parallel_copy(core_.arena->exp_avg_sq(gi), exp_avg_sq, bytes);
    parallel_copy(core_.arena->grad(gi), nullptr, bytes);
    while (was_cached && !core_.arena->seq_reached(gi, core_.expected[gi])) core_.arena->publish(gi);
  }
  core_.arena->node_barrier("write_group: the owner's values");  // visible to the host's ranks after it
  for (int u : core_.plan.group_units[gi]) version_[static_cast<size_t>(u)] = kNoCopy;
}

std::string ParamStore::held_groups_note() const {
  const std::vector<uint8_t>& all = core_.held;
  const size_t held = static_cast<size_t>(std::count(all.begin(), all.end(), uint8_t{1}));
  if (held == all.size()) return "";
  return ::thetad::detail::concat(" holding ", held, " of ", all.size(),
                                  " groups (the others are never used by this job: offload.host_groups: scheduled)");
}

StoreStats ParamStore::stats() const {
  StoreStats s;
  {
    std::lock_guard<std::mutex> lk(core_.stats_mu);
    s = core_.stats;
  }
  s.cpu_adam_ms = core_.updates->cpu_adam_ms();
  s.optimizer_steps = core_.updates->steps();
  return s;
}

}  // namespace thetad::offload
