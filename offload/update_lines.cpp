// The store's update lines (see update_lines.hpp).
#include "offload/update_lines.hpp"

#include <string>

#include "common/errors.hpp"

namespace thetad::offload {

UpdateLines::UpdateLines(StoreCore& core, int64_t lines, size_t line_numel) : core_(core), line_numel_(line_numel) {
  const size_t line_bytes = 3 * line_numel * sizeof(float);
  for (int64_t l = 0; l < lines; ++l) {
    try {
      mem_.push_back(core_.device.alloc(line_bytes));
    } catch (const ConfigError&) {
      for (void* p : mem_) core_.device.free(p);
      throw ConfigError("the device has no room for " + std::to_string(lines) + " update lines of " +
                        std::to_string(line_bytes) + " bytes (a layer's values and Adam moments; " +
                        std::to_string(mem_.size()) + " fit)");
    }
  }
  free_.resize(mem_.size());
  loaded_.resize(mem_.size());
}

UpdateLines::~UpdateLines() {
  for (const std::vector<Fence>* fences : {&free_, &loaded_})
    for (const Fence& f : *fences) {
      try {
        core_.device.host_wait(f);
      } catch (...) {
      }
    }
  for (void* p : mem_) core_.device.free(p);
}

float* UpdateLines::load(size_t gi, bool order_compute) {
  auto it = line_of_.find(gi);
  if (it == line_of_.end()) {
    THETAD_CHECK(line_of_.size() < mem_.size(), InternalError, "offload: every update line is in use (",
                 mem_.size(), " lines)");
    int line = next_;
    while (true) {  // the next line in the ring that no group holds
      bool taken = false;
      for (const auto& [e, l] : line_of_) taken = taken || l == line;
      if (!taken) break;
      line = (line + 1) % static_cast<int>(mem_.size());
    }
    next_ = (line + 1) % static_cast<int>(mem_.size());
    core_.wait_final(gi);
    char* mem = static_cast<char*>(mem_[static_cast<size_t>(line)]);
    Fence last;
    for (int part = 0; part < 3; ++part) last = core_.load_part(gi, mem, line_numel_, part, free_[static_cast<size_t>(line)]);
    loaded_[static_cast<size_t>(line)] = last;
    it = line_of_.emplace(gi, line).first;
  }
  if (order_compute) order(gi);
  return static_cast<float*>(mem_[static_cast<size_t>(it->second)]);
}

void UpdateLines::order(size_t gi) {
  Fence& f = loaded_.at(static_cast<size_t>(line_of_.at(gi)));
  if (f.empty()) return;
  core_.device.compute_wait(f);
  f = Fence{};
}

void UpdateLines::flush(size_t gi) {
  auto it = line_of_.find(gi);
  THETAD_CHECK(it != line_of_.end(), InternalError, "offload: entry ", gi, " is in no update line");
  const auto l = static_cast<size_t>(it->second);
  order(gi);
  const Fence after = core_.device.record_compute();
  const Fence out = core_.flush_line(gi, static_cast<const char*>(mem_[l]), line_numel_, after);
  free_[l] = out;
  line_of_.erase(it);
  core_.count([&](StoreStats& s) { s.device_steps += 1; });
}

void UpdateLines::release_all() {
  if (line_of_.empty()) return;
  for (const auto& [gi, l] : line_of_) order(gi);  // a prefetch's copies end before the line is reused
  const Fence after = core_.device.record_compute();
  for (const auto& [gi, l] : line_of_) free_[static_cast<size_t>(l)] = after;
  line_of_.clear();
}

}  // namespace thetad::offload
