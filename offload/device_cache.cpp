// The device cache's placement policy (see device_cache.hpp).
#include "offload/device_cache.hpp"

#include <algorithm>
#include <unordered_map>

#include "common/errors.hpp"

namespace thetad::offload {

DeviceCachePolicy::DeviceCachePolicy(int64_t lines, std::vector<uint8_t> cacheable)
    : cacheable_(std::move(cacheable)), line_of_(cacheable_.size(), -1) {
  THETAD_CHECK(lines >= 0, InternalError, "device cache: ", lines, " lines");
  line_entry_.assign(static_cast<size_t>(lines), -1);
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

  for (size_t e : now) {
    if (cached(e)) continue;
    if (!cacheable_[e]) {
      d.bypass.push_back(e);
      continue;
    }
    int line = -1;
    for (size_t l = 0; l < line_entry_.size() && line < 0; ++l)
      if (line_entry_[l] < 0) line = static_cast<int>(l);
    if (line < 0) {  // the farthest-used cached entry not needed now, ties to the lowest line
      int64_t far = -1;
      for (size_t l = 0; l < line_entry_.size(); ++l) {
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
  return d;
}

std::vector<std::pair<size_t, int>> DeviceCachePolicy::claim_free(int64_t step, const Need& need,
                                                                 const std::vector<size_t>& busy) {
  std::vector<std::pair<size_t, int>> claimed;
  std::vector<size_t> next = need(step);  // a copy: need() may reuse its storage
  std::sort(next.begin(), next.end());
  size_t l = 0;
  for (size_t e : next) {
    if (cached(e) || !cacheable_[e] || std::find(busy.begin(), busy.end(), e) != busy.end()) continue;
    while (l < line_entry_.size() && line_entry_[l] >= 0) ++l;
    if (l == line_entry_.size()) break;  // no free line left
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
