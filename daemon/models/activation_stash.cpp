// PooledActivationStash (see activation_stash.hpp). Forward: put() queues each saved tensor's
// D2H copy after the compute so far and keeps the device tensor referenced until the copy is
// done (at most `window` layers behind; older ones are handed to the compute stream's order).
// Backward: take() makes the compute stream wait for the layer's H2D copy (started one layer
// earlier) and starts the next layers' in reverse order. Nothing waits for the whole device.
#include "daemon/models/activation_stash.hpp"

#include <algorithm>

#include "common/errors.hpp"

namespace thetad::daemon {

PooledActivationStash::PooledActivationStash(std::unique_ptr<offload::Device> device, int window)
    : device_(std::move(device)), pool_(*device_), window_(std::max(window, 1)) {}

PooledActivationStash::~PooledActivationStash() {
  // Copies still reading or writing pooled host buffers finish before the pool frees them.
  for (auto& [ticket, e] : entries_) {
    device_->host_wait(e.d2h);
    device_->host_wait(e.h2d);
  }
  for (auto& r : returning_) device_->host_wait(r.first);
}

void PooledActivationStash::hold(Entry& e, std::vector<torch::Tensor> tensors) {
  e.on_device = std::move(tensors);
  held_bytes_ += e.bytes;
  stats_.device_peak_bytes = std::max(stats_.device_peak_bytes, held_bytes_);
}

void PooledActivationStash::drop(Entry& e) {
  if (e.on_device.empty()) return;
  e.on_device.clear();
  held_bytes_ -= e.bytes;
}

// Forward's device tensors whose D2H copies are done are let go; beyond the window the compute
// stream is made to wait for the copy instead (the caching allocator reuses memory in compute
// order, so the copy reads it before anything else can write it).
void PooledActivationStash::reap_forward(bool enforce_window) {
  const size_t keep = enforce_window ? static_cast<size_t>(window_) : forward_pending_.size();
  size_t left = forward_pending_.size();
  std::vector<int64_t> still;
  for (int64_t t : forward_pending_) {
    Entry& e = entries_.at(t);
    if (device_->done(e.d2h)) {
      drop(e);
    } else if (left > keep) {
      device_->compute_wait(e.d2h);
      drop(e);
    } else {
      still.push_back(t);
    }
    --left;
  }
  forward_pending_ = std::move(still);
}

int64_t PooledActivationStash::put(int layer, std::vector<torch::Tensor> saved) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t t_us = Timeline::now_us();
  Entry e;
  e.layer = layer;
  // Contiguous first (a view of a joined GEMM's output is not), then the fence: the copies
  // must wait for the compute that makes what they read.
  std::vector<torch::Tensor> src;
  for (const auto& t : saved) src.push_back(t.contiguous());
  const offload::Fence after = device_->record_compute();
  for (const torch::Tensor& c : src) {
    Saved s;
    s.bytes = static_cast<size_t>(c.nbytes());
    s.host = host_buffer(s.bytes);
    s.sizes = c.sizes().vec();
    s.dtype = c.scalar_type();
    s.device = c.device();
    // One stream: the last copy's completion covers the layer's copies.
    e.d2h = device_->d2h(s.host.ptr, c.data_ptr(), s.bytes, after);
    e.bytes += static_cast<int64_t>(s.bytes);
    e.saved.push_back(std::move(s));
  }
  stats_.d2h_bytes += e.bytes;
  stats_.layer_peak_bytes = std::max(stats_.layer_peak_bytes, e.bytes);
  if (timeline_)
    timeline_->record(Lane::d2h, "activations of layer " + std::to_string(layer), t_us, Timeline::now_us() - t_us,
                      {{"bytes", e.bytes}});
  hold(e, std::move(src));
  const int64_t ticket = next_ticket_++;
  entries_.emplace(ticket, std::move(e));
  forward_pending_.push_back(ticket);
  reap_forward(/*enforce_window=*/true);
  return ticket;
}

// Brings an entry's tensors back: an H2D copy into fresh device tensors after the compute so far
// (their memory may have been freed by compute still queued). Its D2H copy must be complete
// first; by backward it nearly always is, and a host wait on that one copy covers the rest.
void PooledActivationStash::fetch(Entry& e) {
  e.fetched = true;
  if (!e.on_device.empty()) return;  // still on the device from forward: used as it is
  if (!device_->done(e.d2h)) device_->host_wait(e.d2h);
  const int64_t t_us = Timeline::now_us();
  const offload::Fence after = device_->record_compute();
  std::vector<torch::Tensor> back;
  for (const Saved& s : e.saved) {
    torch::Tensor t = torch::empty(s.sizes, torch::TensorOptions().dtype(s.dtype).device(s.device));
    e.h2d = device_->h2d(t.data_ptr(), s.host.ptr, s.bytes, after);
    back.push_back(std::move(t));
  }
  stats_.h2d_bytes += e.bytes;
  hold(e, std::move(back));
  if (timeline_)
    timeline_->record(Lane::h2d, "activations of layer " + std::to_string(e.layer), t_us, Timeline::now_us() - t_us,
                      {{"bytes", e.bytes}});
}

// The entry's host buffers go back to the pool once no copy reads or writes them.
void PooledActivationStash::retire(Entry&& e) {
  drop(e);
  const offload::Fence& last = e.h2d.empty() ? e.d2h : e.h2d;
  for (Saved& s : e.saved) returning_.emplace_back(last, s.host);
  reap_returning();
}

void PooledActivationStash::reap_returning() {
  std::vector<std::pair<offload::Fence, offload::PinnedBuffer>> still;
  for (auto& r : returning_) {
    if (device_->done(r.first))
      pool_.put(r.second);
    else
      still.push_back(std::move(r));
  }
  returning_ = std::move(still);
}

// A free pinned buffer; else one an earlier backward's H2D copy still reads, once that copy is
// done; only when none is coming back, a new one. The host runs ahead of the device (it queues
// this forward while the last backward still executes), so without the wait the pool would grow
// by a few buffers a step until the lead settles; with it, the first step's buffers serve all.
offload::PinnedBuffer PooledActivationStash::host_buffer(size_t bytes) {
  reap_returning();
  const size_t cls = offload::PinnedPool::size_class(bytes);
  if (!pool_.has_free(bytes)) {
    // The oldest of its class: backward retired it first.
    auto it = std::find_if(returning_.begin(), returning_.end(), [cls](const auto& r) { return r.second.bytes == cls; });
    if (it != returning_.end()) {
      auto [copy, buffer] = std::move(*it);
      returning_.erase(it);
      device_->host_wait(copy);
      return buffer;
    }
  }
  return pool_.get(bytes);
}

std::vector<torch::Tensor> PooledActivationStash::take(int64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  // Autograd runs one node at a time: the layers taken before have finished their backward.
  for (int64_t t : taken_) {
    retire(std::move(entries_.at(t)));
    entries_.erase(t);
  }
  taken_.clear();
  forward_pending_.clear();  // backward has begun: forward's copies are waited for where needed
  auto it = entries_.find(ticket);
  THETAD_CHECK(it != entries_.end(), InternalError, "activation stash: ticket ", ticket,
               " was never put or was taken twice");
  Entry& e = it->second;
  if (!e.fetched) fetch(e);
  device_->compute_wait(e.h2d);
  std::vector<torch::Tensor> out = e.on_device;
  taken_.push_back(ticket);
  // One layer ahead (window layers): backward visits tickets in reverse order of forward.
  for (int k = 1; k <= window_; ++k) {
    auto next = entries_.find(ticket - k);
    if (next != entries_.end() && !next->second.fetched) fetch(next->second);
  }
  return out;
}

void PooledActivationStash::end_backward() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [ticket, e] : entries_) retire(std::move(e));
  entries_.clear();
  taken_.clear();
  forward_pending_.clear();
}

ActivationStats PooledActivationStash::step_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  ActivationStats s = stats_;
  s.pool_allocations = pool_.allocations();
  s.pool_bytes = static_cast<int64_t>(pool_.bytes());
  stats_ = ActivationStats{};
  stats_.device_peak_bytes = held_bytes_;
  return s;
}

std::unique_ptr<PooledActivationStash> make_activation_stash(const torch::Device& device, void* compute_stream) {
  if (device.is_cuda())
    return std::make_unique<PooledActivationStash>(offload::make_cuda_device(device.index(), compute_stream));
  return std::make_unique<PooledActivationStash>(std::make_unique<offload::HostDevice>());
}

}  // namespace thetad::daemon
