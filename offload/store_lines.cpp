// The parameter store's device cache (see store_lines.hpp and device_cache.hpp): its lines, the
// per-step placement of every rank's schedule, and the copies that load a group with its Adam
// state onto the device and flush it back to the host arena.
#include "offload/store_lines.hpp"

#include <algorithm>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/test_hooks.hpp"
#include "offload/util.hpp"

namespace thetad::offload {

CacheLines::CacheLines(StoreCore& core, Schedule groups_used_at)
    : core_(core), used_schedule_(std::move(groups_used_at)) {
  alloc();
}

CacheLines::~CacheLines() {
  for (const std::vector<Fence>* fences : {&line_loaded_, &line_free_}) {
    for (const Fence& f : *fences) {
      try {
        core_.device.host_wait(f);
      } catch (...) {
      }
    }
  }
  for (void* p : line_mem_) core_.device.free(p);
}

void CacheLines::size_cache(size_t bytes) {
  THETAD_CHECK(line_mem_.empty() && core_.opts.cache_bytes == 0, InternalError,
               "offload: size_cache on a store whose device cache is already sized");
  core_.opts.cache_bytes = bytes;
  alloc();
  log(" (sized after the first step)");
}

void CacheLines::log(const char* when) const {
  if (line_mem_.empty()) return;
  THETAD_LOG(info, "offload") << "device cache" << when << ": " << line_mem_.size() << " lines of "
                              << mib(3 * line_numel_ * sizeof(float)) << " MiB (a group with its Adam state; "
                              << mib(core_.stats.cache_line_bytes)
                              << " MiB): cached groups are updated on the device, the others by their owner's CPU AdamW";
  if (policy_.transit_lines() > 0) {
    const UncachedUpdate mode = core_.opts.uncached_update;
    THETAD_LOG(info, "offload") << "device cache: " << policy_.transit_lines() << " of its lines are transit lines "
                                << "(offload.uncached_update: " << (mode == UncachedUpdate::Device ? "device" : "auto")
                                << "): a group the cache does not keep "
                                << (mode == UncachedUpdate::Device
                                        ? "is streamed through one"
                                        : "is streamed through one where the measured bandwidths favour it")
                                << ", with its Adam state, and updated on the device";
  }
}

// As many lines as the budget holds, at most one per unsharded group the arena holds (a line for
// a group the job never uses would stay empty), allocated until the device refuses; then every
// rank keeps the fewest any rank got, so that all place groups alike. Lines for fewer groups than
// that: with offload.uncached_update device or auto, some of them are transit lines.
void CacheLines::alloc() {
  const StorePlan& plan = core_.plan;
  std::vector<uint8_t> cacheable(plan.index.size(), 0);
  int64_t want = 0;
  if (core_.opts.cache_bytes > 0 && used_schedule_) {
    // Whole flat groups only: a [rows x row_elems] group is streamed by the model in row chunks
    // through the slots (a unit each), even where it has one shard.
    for (size_t gi = 0; gi < cacheable.size(); ++gi)
      if (core_.held[gi] && plan.group_units[gi].size() == 1 &&
          plan.units[static_cast<size_t>(plan.group_units[gi][0])].row_elems == 1) {
        cacheable[gi] = 1;
        line_numel_ = std::max(line_numel_, plan.group_numel[gi]);
        ++want;
      }
  }
  const int64_t groups = want;
  if (line_numel_ > 0)
    want = std::min<int64_t>(want, static_cast<int64_t>(core_.opts.cache_bytes / (3 * line_numel_ * sizeof(float))));
  for (int64_t l = 0; l < want; ++l) {
    try {
      line_mem_.push_back(core_.device.alloc(3 * line_numel_ * sizeof(float)));
    } catch (const ConfigError&) {
      break;  // the device is full: fewer lines
    }
  }
  int64_t lines = static_cast<int64_t>(line_mem_.size());
  if (want > 0) {
    try {
      test_hooks::stall_at(test_hooks::StallPoint::cache_agreement, core_.plane.rank());
      lines = core_.plane.min(std::vector<int64_t>{lines}, {"offload: the agreement on the device cache's lines"})[0];
    } catch (...) {  // a timeout: the lines go with this rank's store (no destructor runs)
      for (void* p : line_mem_) core_.device.free(p);
      line_mem_.clear();
      throw;
    }
  }
  while (static_cast<int64_t>(line_mem_.size()) > lines) {
    core_.device.free(line_mem_.back());
    line_mem_.pop_back();
  }
  line_free_.resize(line_mem_.size());
  line_loaded_.resize(line_mem_.size());
  state_loaded_.resize(line_mem_.size());
  // Transit lines: half the lines at most, and no more than the groups any of the next steps
  // uses (the cache keeps the rest). Every rank computes the same count from the schedule.
  int64_t transit = 0;
  if (core_.opts.uncached_update != UncachedUpdate::Host && lines >= 2 && lines < groups) {
    int64_t peak = 0;
    const int64_t from = std::max<int64_t>(core_.now, 0);
    for (int64_t s = from; s < from + DeviceCachePolicy::kHorizon; ++s) {
      int64_t k = 0;
      for (size_t gi : used_at(s)) k += cacheable[gi];
      peak = std::max(peak, k);
    }
    transit = std::min(lines / 2, peak);
  }
  policy_ = DeviceCachePolicy(lines, std::move(cacheable), transit, plan.group_numel);
  policy_.set_uncached_update(core_.opts.uncached_update, [this] { return measure_bandwidths(); },
                              core_.opts.bf16_copies);
  core_.stats.cache_line_bytes = line_mem_.size() * 3 * line_numel_ * sizeof(float);
}

// offload.uncached_update: auto, at its first choice (every rank at the same place()): this
// rank's bandwidths, then the lowest of each over the job's ranks, so that all choose alike.
UpdateBandwidths CacheLines::measure_bandwidths() {
  // The last line is a transit line, and no group was streamed before the first choice.
  const UpdateBandwidths bw =
      core_.agreed_bandwidths(line_mem_.back(), line_numel_, "offload: the agreement on the measured bandwidths");
  THETAD_LOG(info, "offload") << "uncached groups (offload.uncached_update: auto), measured at step " << core_.now
                              << " on groups of " << line_numel_ << " parameters: PCIe " << bw.h2d / 1e9
                              << " GB/s to the device, " << bw.d2h / 1e9 << " GB/s back, CPU AdamW "
                              << bw.cpu_adam / 1e9 << " GB/s (28 B per parameter). A group the cache does not "
                              << "keep is streamed through a transit line (12 B per parameter each way) where that "
                              << "shortens the step's slowest of these, else its owner's CPU AdamW updates it "
                              << "(4 B each way, 28 B through host memory)";
  return bw;
}

const std::vector<size_t>& CacheLines::used_at(int64_t step) {
  auto it = used_cache_.find(step);
  if (it != used_cache_.end()) return it->second;
  std::vector<size_t> entries;
  for (int g : used_schedule_(step))
    if (g != 0) entries.push_back(core_.index_of(g));
  std::sort(entries.begin(), entries.end());
  entries.erase(std::unique(entries.begin(), entries.end()), entries.end());
  return used_cache_.emplace(step, std::move(entries)).first->second;
}

void CacheLines::forget_before(int64_t step) { used_cache_.erase(used_cache_.begin(), used_cache_.lower_bound(step)); }

float* CacheLines::line_part(int group, int part) {
  const size_t gi = core_.index_of(group);
  const int line = policy_.line(gi);
  THETAD_CHECK(line >= 0, InternalError, "offload: group ", group, " is not in the device cache");
  return static_cast<float*>(line_mem_[static_cast<size_t>(line)]) + static_cast<size_t>(part) * line_numel_;
}

void CacheLines::place(int64_t step) {
  if (policy_.lines() == 0) return;
  for (Fence& f : line_loaded_) {  // loaded during the step before (prefetch)
    core_.device.compute_wait(f);
    f = Fence{};
  }
  order_state();  // (the step before called it, unless it updated nothing on the device)
  const int64_t transit = policy_.transit_lines();
  const DeviceCachePolicy::Decision d =
      policy_.decide(step, [this](int64_t s) -> const std::vector<size_t>& { return used_at(s); });
  if (policy_.transit_lines() != transit) {
    THETAD_LOG(info, "offload") << "device cache: at these bandwidths streaming a group never shortens a step; its "
                                << transit << " transit lines are cache lines from step " << step + 1 << " on";
  }
  for (const auto& [gi, line] : d.evict) flush_line(gi, line);
  for (const auto& [gi, line] : d.load) load_line(gi, line);
  // Streamed groups: every group's values first (forward waits for them), then their Adam state
  // (the update waits for it), on the one in-order H2D stream.
  for (const auto& [gi, line] : d.stream) load_line(gi, line, LineWait::values_now);
  for (const auto& [gi, line] : d.stream) load_state(gi, line);
}

void CacheLines::prefetch(int64_t step) {
  if (policy_.lines() == 0 || core_.opts.prefetch <= 0) return;
  const std::vector<size_t> busy = used_at(step);  // a copy: used_at may rehash its cache
  const auto need = [this](int64_t s) -> const std::vector<size_t>& { return used_at(s); };
  for (const auto& [gi, line] : policy_.claim_free(step + 1, need, busy)) load_line(gi, line, LineWait::next_step);
}

void CacheLines::order_state() {
  for (Fence& f : state_loaded_) {
    if (f.empty()) continue;
    core_.device.compute_wait(f);
    f = Fence{};
  }
}

// The group (params, m, v) into its line, once its last host update has landed; values first,
// on the one in-order H2D stream. values_now: the values only (load_state follows).
void CacheLines::load_line(size_t gi, int line, LineWait wait) {
  (void)core_.held_index(core_.plan.index.group_of(gi));
  core_.wait_final(gi);
  const auto l = static_cast<size_t>(line);
  const Fence values = core_.load_part(gi, static_cast<char*>(line_mem_[l]), line_numel_, 0, line_free_[l]);
  if (wait == LineWait::values_now) {
    core_.device.compute_wait(values);
    return;
  }
  load_state(gi, line);
  Fence& state = state_loaded_[l];
  if (wait == LineWait::now) core_.device.compute_wait(state);
  else line_loaded_[l] = state;
  state = Fence{};
}

// The group's Adam state (m, v) into its line after its values: the compute stream waits for it
// at order_state().
void CacheLines::load_state(size_t gi, int line) {
  const auto l = static_cast<size_t>(line);
  for (int part : {1, 2})
    state_loaded_[l] = core_.load_part(gi, static_cast<char*>(line_mem_[l]), line_numel_, part, line_free_[l]);
  core_.count([&](StoreStats& s) { s.cache_loads += 1; });
}

// A reader of the line outside the compute stream (a checkpoint, resume) waits for its load
// (one for the next step, or a transit line's Adam state).
void CacheLines::wait_early_load(int line) {
  for (Fence* f : {&line_loaded_.at(static_cast<size_t>(line)), &state_loaded_.at(static_cast<size_t>(line))}) {
    core_.device.host_wait(*f);
    *f = Fence{};
  }
}

void CacheLines::read(size_t gi, float* params, float* exp_avg, float* exp_avg_sq) {
  const int line = policy_.line(gi);
  wait_early_load(line);
  const Fence after = core_.device.record_compute();
  const size_t bytes = core_.arena->entry(gi).numel * sizeof(float);
  float* dst[3] = {params, exp_avg, exp_avg_sq};
  const char* src = static_cast<const char*>(line_mem_[static_cast<size_t>(line)]);
  for (size_t k = 0; k < 3; ++k)
    if (dst[k]) core_.device.host_wait(core_.device.d2h(dst[k], src + k * line_numel_ * sizeof(float), bytes, after));
}

void CacheLines::drop(size_t gi) {
  const int line = policy_.line(gi);
  wait_early_load(line);
  line_free_[static_cast<size_t>(line)] = core_.device.record_compute();
  policy_.drop(gi);
}

// The group back to the host with its state: the owner copies params, m and v into the arena
// after the compute queued so far (its last device update) and publishes the updates it had on
// the device once the copies landed; the host's other ranks wait for that as for a CPU update.
void CacheLines::flush_line(size_t gi, int line) {
  const auto l = static_cast<size_t>(line);
  const Fence after = core_.device.record_compute();
  line_free_[l] = core_.flush_line(gi, static_cast<const char*>(line_mem_[l]), line_numel_, after);
  if (core_.arena->is_owner(gi)) core_.count([&](StoreStats& s) { s.cache_flushes += 1; });
}

}  // namespace thetad::offload
