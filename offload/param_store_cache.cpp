// The parameter store's device cache (see param_store.hpp and device_cache.hpp): its lines, the
// per-step placement of every rank's schedule, and the copies that load a group with its Adam
// state onto the device and flush it back to the host arena.
#include <mpi.h>

#include <algorithm>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "offload/bandwidth_probe.hpp"
#include "offload/param_store.hpp"

namespace thetad::offload {

// As many lines as the budget holds, at most one per unsharded group the arena holds (a line for
// a group the job never uses would stay empty), allocated until the device refuses; then every
// rank keeps the fewest any rank got, so that all place groups alike. Lines for fewer groups than
// that: with offload.uncached_update device or auto, some of them are transit lines.
void ParamStore::alloc_lines(MPI_Comm comm) {
  std::vector<uint8_t> cacheable(plan_.index.size(), 0);
  int64_t want = 0;
  if (opts_.cache_bytes > 0 && used_schedule_) {
    // Whole flat groups only: a [rows x row_elems] group is streamed by the model in row chunks
    // through the slots (a unit each), even where it has one shard.
    for (size_t gi = 0; gi < cacheable.size(); ++gi)
      if (held_[gi] && plan_.group_units[gi].size() == 1 &&
          plan_.units[static_cast<size_t>(plan_.group_units[gi][0])].row_elems == 1) {
        cacheable[gi] = 1;
        line_numel_ = std::max(line_numel_, plan_.group_numel[gi]);
        ++want;
      }
  }
  const int64_t groups = want;
  if (line_numel_ > 0) want = std::min<int64_t>(want, static_cast<int64_t>(opts_.cache_bytes / (3 * line_numel_ * sizeof(float))));
  for (int64_t l = 0; l < want; ++l) {
    try {
      line_mem_.push_back(device_.alloc(3 * line_numel_ * sizeof(float)));
    } catch (const ConfigError&) {
      break;  // the device is full: fewer lines
    }
  }
  int64_t lines = static_cast<int64_t>(line_mem_.size());
  if (want > 0) MPI_Allreduce(MPI_IN_PLACE, &lines, 1, MPI_INT64_T, MPI_MIN, comm);
  while (static_cast<int64_t>(line_mem_.size()) > lines) {
    device_.free(line_mem_.back());
    line_mem_.pop_back();
  }
  line_free_.resize(line_mem_.size());
  line_loaded_.resize(line_mem_.size());
  state_loaded_.resize(line_mem_.size());
  // Transit lines: half the lines at most, and no more than the groups any of the next steps
  // uses (the cache keeps the rest). Every rank computes the same count from the schedule.
  int64_t transit = 0;
  if (opts_.uncached_update != UncachedUpdate::Host && lines >= 2 && lines < groups) {
    int64_t peak = 0;
    const int64_t from = std::max<int64_t>(now_, 0);
    for (int64_t s = from; s < from + DeviceCachePolicy::kHorizon; ++s) {
      int64_t k = 0;
      for (size_t gi : used_at(s)) k += cacheable[gi];
      peak = std::max(peak, k);
    }
    transit = std::min(lines / 2, peak);
  }
  lines_ = DeviceCachePolicy(lines, std::move(cacheable), transit, plan_.group_numel);
  lines_.set_uncached_update(opts_.uncached_update, [this] { return measure_bandwidths(); }, opts_.bf16_copies);
  stats_.cache_line_bytes = line_mem_.size() * 3 * line_numel_ * sizeof(float);
}

// offload.uncached_update: auto, at its first choice (every rank at the same place()): this
// rank's bandwidths, then the lowest of each over the job's ranks, so that all choose alike.
UpdateBandwidths ParamStore::measure_bandwidths() {
  updates_->wait_idle();         // the CPU AdamW of the step before is not measured against
  device_.host_wait(last_d2h_);  // nor are its copies
  // The last line is a transit line, and no group was streamed before the first choice.
  UpdateBandwidths bw = probe_bandwidths(device_, line_mem_.back(), line_numel_);
  double v[3] = {bw.h2d, bw.d2h, bw.cpu_adam};
  MPI_Allreduce(MPI_IN_PLACE, v, 3, MPI_DOUBLE, MPI_MIN, comm_);
  bw = {v[0], v[1], v[2]};
  THETAD_LOG(info, "offload") << "uncached groups (offload.uncached_update: auto), measured at step " << now_
                              << " on groups of " << line_numel_ << " parameters: PCIe " << bw.h2d / 1e9
                              << " GB/s to the device, " << bw.d2h / 1e9 << " GB/s back, CPU AdamW "
                              << bw.cpu_adam / 1e9 << " GB/s (28 B per parameter). A group the cache does not "
                              << "keep is streamed through a transit line (12 B per parameter each way) where that "
                              << "shortens the step's slowest of these, else its owner's CPU AdamW updates it "
                              << "(4 B each way, 28 B through host memory)";
  return bw;
}

const std::vector<size_t>& ParamStore::used_at(int64_t step) {
  auto it = used_cache_.find(step);
  if (it != used_cache_.end()) return it->second;
  std::vector<size_t> entries;
  for (int g : used_schedule_(step))
    if (g != 0) entries.push_back(index_of(g));
  std::sort(entries.begin(), entries.end());
  entries.erase(std::unique(entries.begin(), entries.end()), entries.end());
  return used_cache_.emplace(step, std::move(entries)).first->second;
}

float* ParamStore::line_part(int group, int part) {
  const size_t gi = index_of(group);
  const int line = lines_.line(gi);
  THETAD_CHECK(line >= 0, InternalError, "offload: group ", group, " is not in the device cache");
  return static_cast<float*>(line_mem_[static_cast<size_t>(line)]) + static_cast<size_t>(part) * line_numel_;
}

void ParamStore::place(int64_t step) {
  updates_->rethrow_error();
  begin_step(step);
  if (lines_.lines() == 0) return;
  for (Fence& f : line_loaded_) {  // loaded during the step before (prefetch_for)
    device_.compute_wait(f);
    f = Fence{};
  }
  order_state();  // (the step before called it, unless it updated nothing on the device)
  const int64_t transit = lines_.transit_lines();
  const DeviceCachePolicy::Decision d =
      lines_.decide(step, [this](int64_t s) -> const std::vector<size_t>& { return used_at(s); });
  if (lines_.transit_lines() != transit) {
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

void ParamStore::order_state() {
  for (Fence& f : state_loaded_) {
    if (f.empty()) continue;
    device_.compute_wait(f);
    f = Fence{};
  }
}

// The group (params, m, v) into its line, once its last host update has landed; values first,
// on the one in-order H2D stream. values_now: the values only (load_state follows).
void ParamStore::load_line(size_t gi, int line, LineWait wait) {
  (void)held_index(plan_.index.group_of(gi));
  wait_final(gi);
  const size_t bytes = arena_->entry(gi).numel * sizeof(float);
  const auto l = static_cast<size_t>(line);
  const Fence values = copy_split(true, static_cast<char*>(line_mem_[l]), reinterpret_cast<const char*>(arena_->params(gi)),
                                  bytes, line_free_[l]);
  {
    std::lock_guard<std::mutex> lk(stats_mu_);
    stats_.h2d_bytes += bytes;
  }
  if (wait == LineWait::values_now) {
    device_.compute_wait(values);
    return;
  }
  load_state(gi, line);
  Fence& state = state_loaded_[l];
  if (wait == LineWait::now) device_.compute_wait(state);
  else line_loaded_[l] = state;
  state = Fence{};
}

// The group's Adam state (m, v) into its line after its values: the compute stream waits for it
// at order_state().
void ParamStore::load_state(size_t gi, int line) {
  const size_t bytes = arena_->entry(gi).numel * sizeof(float);
  const auto l = static_cast<size_t>(line);
  char* dst = static_cast<char*>(line_mem_[l]);
  const float* parts[2] = {arena_->exp_avg(gi), arena_->exp_avg_sq(gi)};
  for (size_t k = 0; k < 2; ++k)
    state_loaded_[l] = copy_split(true, dst + (k + 1) * line_numel_ * sizeof(float),
                                  reinterpret_cast<const char*>(parts[k]), bytes, line_free_[l]);
  std::lock_guard<std::mutex> lk(stats_mu_);
  stats_.h2d_bytes += 2 * bytes;
  stats_.cache_loads += 1;
}

// A reader of the line outside the compute stream (a checkpoint, resume) waits for its load
// (one for the next step, or a transit line's Adam state).
void ParamStore::wait_early_load(int line) {
  for (Fence* f : {&line_loaded_.at(static_cast<size_t>(line)), &state_loaded_.at(static_cast<size_t>(line))}) {
    device_.host_wait(*f);
    *f = Fence{};
  }
}

// The group back to the host with its state: the owner copies params, m and v into the arena
// after the compute queued so far (its last device update) and publishes the updates it had on
// the device once the copies landed; the host's other ranks wait for that as for a CPU update.
void ParamStore::flush_line(size_t gi, int line) {
  const Fence after = device_.record_compute();
  line_free_[static_cast<size_t>(line)] = after;
  if (!arena_->is_owner(gi)) return;
  const size_t bytes = arena_->entry(gi).numel * sizeof(float);
  const char* src = static_cast<const char*>(line_mem_[static_cast<size_t>(line)]);
  float* parts[3] = {arena_->params(gi), arena_->exp_avg(gi), arena_->exp_avg_sq(gi)};
  std::vector<Fence> copies;
  for (size_t k = 0; k < 3; ++k)
    copies.push_back(copy_split(false, reinterpret_cast<char*>(parts[k]), src + k * line_numel_ * sizeof(float), bytes, after));
  line_free_[static_cast<size_t>(line)] = copies.back();
  last_d2h_ = copies.back();
  updates_->submit_publish(gi, std::move(copies), expected_[gi]);
  std::lock_guard<std::mutex> lk(stats_mu_);
  stats_.d2h_bytes += 3 * bytes;
  stats_.cache_flushes += 1;
}

}  // namespace thetad::offload
