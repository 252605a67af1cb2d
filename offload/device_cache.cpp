// The device cache's placement policy (see device_cache.hpp).
#include "offload/device_cache.hpp"

#include <algorithm>
#include <unordered_map>

#include "common/errors.hpp"

namespace thetad::offload {
namespace {

// Bytes a set of bypassing groups moves per step, by resource: what Auto balances.
struct Traffic {
  double h2d = 0, d2h = 0, cpu = 0;
  double before_forward = 0;  // H2D bytes the step's forward waits for (a transit line's values)

  // Seconds the step's slowest resource needs, plus the copies its forward waits for.
  double seconds(const UpdateBandwidths& bw) const {
    return std::max({h2d / bw.h2d, d2h / bw.d2h, cpu / bw.cpu_adam}) + before_forward / bw.h2d;
  }
};

// A group of n parameters updated on the host: its values in (prefetched ahead of the step), its
// gradient out, and the owner's CPU AdamW over p, g, m, v. With bf16 copies the values cross as
// bf16 and the AdamW writes that copy too.
void add_host(Traffic& t, double n, bool bf16_copies, double sign = 1) {
  t.h2d += sign * n * (bf16_copies ? 2 : 4);
  t.d2h += sign * n * 4;
  t.cpu += sign * n * (bf16_copies ? 30 : 28);
}

// The same group streamed through a transit line: p, m, v in (forward waits for p) and out.
void add_device(Traffic& t, double n) {
  t.h2d += n * 12;
  t.d2h += n * 12;
  t.before_forward += n * 4;
}

// Moves one of the groups in `t` (n parameters, on the host) to a transit line if that shortens
// the step; says whether it did.
bool move_if_shorter(Traffic& t, double n, const UpdateBandwidths& bw, bool bf16_copies) {
  Traffic moved = t;
  add_host(moved, n, bf16_copies, -1);
  add_device(moved, n);
  if (moved.seconds(bw) >= t.seconds(bw)) return false;
  t = moved;
  return true;
}

}  // namespace

DeviceCachePolicy::DeviceCachePolicy(int64_t lines, std::vector<uint8_t> cacheable, int64_t transit,
                                     std::vector<size_t> numel)
    : cacheable_(std::move(cacheable)), numel_(std::move(numel)), transit_(transit), line_of_(cacheable_.size(), -1) {
  THETAD_CHECK(lines >= 0 && transit >= 0 && transit <= lines, InternalError, "device cache: ", lines, " lines, ",
               transit, " of them transit lines");
  line_entry_.assign(static_cast<size_t>(lines), -1);
}

void DeviceCachePolicy::set_uncached_update(UncachedUpdate mode, std::function<UpdateBandwidths()> measure,
                                            bool bf16_copies) {
  THETAD_CHECK(mode != UncachedUpdate::Auto || (measure && numel_.size() == cacheable_.size()), InternalError,
               "device cache: auto placement needs the groups' sizes and a way to measure bandwidths");
  mode_ = mode;
  measure_ = std::move(measure);
  bf16_copies_ = bf16_copies;
}

std::vector<size_t> DeviceCachePolicy::cached_entries() const {
  std::vector<size_t> out;
  for (size_t e = 0; e < line_of_.size(); ++e)
    if (line_of_[e] >= 0) out.push_back(e);
  return out;
}

DeviceCachePolicy::Decision DeviceCachePolicy::decide(int64_t step, const Need& need) {
  Decision d;
  std::vector<size_t> now = need(step);  // a copy: need() may reuse its storage
  std::sort(now.begin(), now.end());     // every rank walks the same order
  if (line_entry_.empty()) {
    d.bypass = now;
    return d;
  }
  // Next use after this step of every entry the horizon mentions (absent: never). Read only on
  // a miss with every line taken: in steady state (everything needed is cached) never.
  std::unordered_map<size_t, int64_t> next;
  bool horizon_read = false;
  const auto next_use = [&](size_t e) {
    if (!horizon_read) {
      for (int64_t s = step + kHorizon; s > step; --s)
        for (size_t x : need(s)) next[x] = s;
      horizon_read = true;
    }
    const auto it = next.find(e);
    return it == next.end() ? kNever : it->second;
  };
  std::vector<uint8_t> used_now(line_of_.size(), 0);
  for (size_t e : now) used_now.at(e) = 1;

  // A streamed group leaves its transit line at the first step that does not use it.
  // Free transit lines, those free before this step first: a line flushed now takes its next
  // load only after the flush (one line's bytes each way, in turn).
  std::vector<int> free_transit_lines, flushed_now;
  for (size_t l = static_cast<size_t>(cache_lines()); l < line_entry_.size(); ++l) {
    if (line_entry_[l] < 0) {
      free_transit_lines.push_back(static_cast<int>(l));
    } else if (!used_now[static_cast<size_t>(line_entry_[l])]) {
      d.evict.emplace_back(static_cast<size_t>(line_entry_[l]), static_cast<int>(l));
      line_of_[static_cast<size_t>(line_entry_[l])] = -1;
      line_entry_[l] = -1;
      flushed_now.push_back(static_cast<int>(l));
    }
  }
  free_transit_lines.insert(free_transit_lines.end(), flushed_now.begin(), flushed_now.end());
  const int free_transit = static_cast<int>(free_transit_lines.size());

  const auto cache_end = static_cast<size_t>(cache_lines());
  for (size_t e : now) {
    if (cached(e)) continue;
    if (!cacheable_[e]) {
      d.bypass.push_back(e);
      continue;
    }
    int line = -1;
    for (size_t l = 0; l < cache_end && line < 0; ++l)
      if (line_entry_[l] < 0) line = static_cast<int>(l);
    if (line < 0) {  // the farthest-used cached entry not needed now, ties to the lowest line
      int64_t far = -1;
      for (size_t l = 0; l < cache_end; ++l) {
        const auto v = static_cast<size_t>(line_entry_[l]);
        if (used_now[v]) continue;
        const int64_t nv = next_use(v);
        if (nv > far) {
          far = nv;
          line = static_cast<int>(l);
        }
      }
      if (line < 0 || far <= next_use(e)) {  // everything cached is needed sooner (or now)
        d.bypass.push_back(e);
        continue;
      }
      const auto victim = static_cast<size_t>(line_entry_[static_cast<size_t>(line)]);
      d.evict.emplace_back(victim, line);
      line_of_[victim] = -1;
    }
    line_entry_[static_cast<size_t>(line)] = static_cast<int64_t>(e);
    line_of_[e] = line;
    d.load.emplace_back(e, line);
  }

  if (free_transit == 0 || mode_ == UncachedUpdate::Host || d.bypass.empty()) return d;
  size_t k = 0;
  for (size_t e : choose_streamed(d.bypass, free_transit, next_use)) {
    const int l = free_transit_lines[k++];
    line_entry_[static_cast<size_t>(l)] = static_cast<int64_t>(e);
    line_of_[e] = l;
    d.stream.emplace_back(e, l);
  }
  return d;
}

// Candidates are the cacheable bypassing groups, soonest next use first (their host update is
// the one the next steps would wait for). Device: each takes a free transit line. Auto: from all
// of them on the host, one moves to the device when that shortens the step's slowest resource.
std::vector<size_t> DeviceCachePolicy::choose_streamed(std::vector<size_t>& bypass, int free_transit,
                                                       const std::function<int64_t(size_t)>& next_use) {
  std::vector<size_t> candidates;
  for (size_t e : bypass)
    if (cacheable_[e]) candidates.push_back(e);
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](size_t a, size_t b) { return next_use(a) < next_use(b); });
  if (static_cast<int>(candidates.size()) > free_transit && mode_ == UncachedUpdate::Device)
    candidates.resize(static_cast<size_t>(free_transit));
  std::vector<size_t> streamed;
  if (mode_ == UncachedUpdate::Device) {
    streamed = candidates;
  } else if (!candidates.empty()) {
    if (!measured_) {
      bandwidths_ = measure_();
      measured_ = true;
      if (!streaming_can_pay()) {  // the transit lines join the cache from the next step on
        transit_ = 0;
        return {};
      }
    }
    Traffic all_host;
    for (size_t e : candidates) add_host(all_host, static_cast<double>(numel_[e]), bf16_copies_);
    for (size_t e : candidates) {
      if (static_cast<int>(streamed.size()) == free_transit) break;
      if (move_if_shorter(all_host, static_cast<double>(numel_[e]), bandwidths_, bf16_copies_)) streamed.push_back(e);
    }
  }
  std::vector<size_t> rest;
  for (size_t e : bypass)
    if (std::find(streamed.begin(), streamed.end(), e) == streamed.end()) rest.push_back(e);
  bypass = std::move(rest);
  return streamed;
}

// Whether streaming shortens any step at these bandwidths: one of `transit` + 1 bypassing groups
// of the largest cacheable size moved to the device (the case most in its favour: the most
// groups competing for the CPU). If not, transit lines would only be cache lines lost.
bool DeviceCachePolicy::streaming_can_pay() const {
  double n = 0;
  for (size_t e = 0; e < cacheable_.size(); ++e)
    if (cacheable_[e]) n = std::max(n, static_cast<double>(numel_[e]));
  Traffic all_host;
  for (int64_t k = 0; k <= transit_; ++k) add_host(all_host, n, bf16_copies_);
  return move_if_shorter(all_host, n, bandwidths_, bf16_copies_);
}

std::vector<std::pair<size_t, int>> DeviceCachePolicy::claim_free(int64_t step, const Need& need,
                                                                 const std::vector<size_t>& busy) {
  std::vector<std::pair<size_t, int>> claimed;
  std::vector<size_t> next = need(step);  // a copy: need() may reuse its storage
  std::sort(next.begin(), next.end());
  const auto cache_end = static_cast<size_t>(cache_lines());
  size_t l = 0;
  for (size_t e : next) {
    if (cached(e) || !cacheable_[e] || std::find(busy.begin(), busy.end(), e) != busy.end()) continue;
    while (l < cache_end && line_entry_[l] >= 0) ++l;
    if (l == cache_end) break;  // no free line left
    line_entry_[l] = static_cast<int64_t>(e);
    line_of_[e] = static_cast<int>(l);
    claimed.emplace_back(e, static_cast<int>(l));
  }
  return claimed;
}

void DeviceCachePolicy::drop(size_t entry) {
  const int line = line_of_.at(entry);
  if (line < 0) return;
  line_entry_[static_cast<size_t>(line)] = -1;
  line_of_[entry] = -1;
}

}  // namespace thetad::offload
