// GradBuffers (see grad_buffers.hpp).
#include "comm/engine/grad_buffers.hpp"

#include <algorithm>

#include "common/errors.hpp"

namespace thetad::comm::engine_detail {

GradBuffers::GradBuffers(Communicator& comm, const BucketPlan& plan, const EngineOptions& opts, StepStats& stats)
    : comm_(comm), plan_(plan), opts_(opts), stats_(stats) {
  const size_t nb = plan_.buckets.size();
  if (!opts_.grad_memory.empty() && static_cast<int>(opts_.grad_memory.size()) != plan_.num_groups)
    throw InternalError("EngineOptions::grad_memory needs one mode per group");
  for (const Bucket& b : plan_.buckets)
    if (streamed(b.group) && b.params.size() != 1)
      throw InternalError(detail::concat("bucket ", b.index, " of streamed group ", b.group, " holds ",
                                         b.params.size(), " parameters; streamed parameters need a "
                                         "bucket of their own (ParamInfo::alone)"));
  std::vector<size_t> group_elems(plan_.num_groups, 0);
  for (const Bucket& b : plan_.buckets) {
    bucket_offset_.push_back(group_elems[b.group]);
    group_elems[b.group] += b.numel;
    const bool own = mode(b.group) == GradMemory::owned || mode(b.group) == GradMemory::overwrite;
    buffers_.push_back(own ? comm_.allocate(b.numel * sizeof(float)) : nullptr);
  }
  for (int g = 0; g < plan_.num_groups; ++g) {
    if (mode(g) == GradMemory::pooled) pool_elems_ = std::max(pool_elems_, group_elems[g]);
    if (adopted(g) && comm_.size() != 1)
      throw InternalError(detail::concat("group ", g, " adopts autograd's gradients, which needs a world of one rank, not ",
                                         comm_.size()));
  }
  adopted_.assign(plan_.params.size(), nullptr);
  slot_of_group_.assign(plan_.num_groups, -1);
  dirty_.assign(nb, 0);
  stale_.assign(nb, 0);
  ext_.assign(nb, nullptr);
  ext_keep_.assign(nb, nullptr);
}

size_t GradBuffers::bytes() const {
  size_t bytes = 0;
  for (size_t b = 0; b < plan_.buckets.size(); ++b)
    if (buffers_[b]) bytes += plan_.buckets[b].numel * sizeof(float);
  return bytes + pool_.size() * pool_elems_ * sizeof(float);
}

void GradBuffers::start_window() {
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    stale_[b] = dirty_[b];
    if (dirty_[b] && mode(plan_.buckets[b].group) != GradMemory::overwrite) {  // overwrite: zero_unwritten
      if (buffers_[b]) comm_.zero(buffers_[b].get(), plan_.buckets[b].numel * sizeof(float));
      dirty_[b] = 0;
    }
  }
  // Pooled groups give their buffers back; a group bound again is zeroed then.
  for (int g = 0; g < plan_.num_groups; ++g)
    if (slot_of_group_[g] >= 0) {
      free_slots_.push_back(slot_of_group_[g]);
      slot_of_group_[g] = -1;
    }
  std::fill(ext_.begin(), ext_.end(), nullptr);
  std::fill(ext_keep_.begin(), ext_keep_.end(), nullptr);
  release_held(true);
  held_bytes_ = 0;
  for (int p : adopted_now_) adopted_[static_cast<size_t>(p)] = nullptr;
  adopted_now_.clear();
  adopted_bytes_ = 0;
  adopted_zeros_.clear();
}

void GradBuffers::adopt(int param, float* data) {
  float*& at = adopted_[static_cast<size_t>(param)];
  if (at == data) return;  // a later micro-step: autograd added into the same tensor
  if (!at) {
    adopted_now_.push_back(param);
    adopted_bytes_ += plan_.params[static_cast<size_t>(param)].numel * sizeof(float);
  }
  at = data;
}

float* GradBuffers::adopted_grad(int param, bool zeros_if_none) {
  float*& at = adopted_[static_cast<size_t>(param)];
  if (at || !zeros_if_none) return at;
  const size_t bytes = plan_.params[static_cast<size_t>(param)].numel * sizeof(float);
  adopted_zeros_.push_back(comm_.allocate(bytes));  // zero-initialised
  at = static_cast<float*>(adopted_zeros_.back().get());
  adopted_now_.push_back(param);
  return at;
}

float* GradBuffers::bucket_ptr(int b) {
  const int g = plan_.buckets[b].group;
  switch (mode(g)) {
    case GradMemory::streamed: return ext_[b] ? ext_[b] : scratch(b);
    case GradMemory::pooled: return group_base(g) + bucket_offset_[b];
    case GradMemory::none: throw InternalError(detail::concat("bucket ", b, " of group ", g, ", which has no gradient"));
    case GradMemory::adopted: throw InternalError(detail::concat("bucket ", b, " of group ", g, " has no memory: its gradients are adopted"));
    case GradMemory::owned:
    case GradMemory::overwrite: break;
  }
  return static_cast<float*>(buffers_[b].get());
}

// Streamed bucket b without a handed-over buffer: zeroed scratch memory.
float* GradBuffers::scratch(int b) {
  const size_t bytes = bucket_bytes(b);
  std::shared_ptr<void> mem;
  if (opts_.scratch) {
    mem = opts_.scratch(bytes);
  } else {
    mem = comm_.allocate(bytes);
    comm_.zero(mem.get(), bytes);
  }
  if (!mem) throw InternalError(detail::concat("no scratch memory for streamed bucket ", b));
  release_held(false);  // the caller may have waited for earlier buckets
  hold_bytes(static_cast<int64_t>(bytes));
  ext_[b] = static_cast<float*>(mem.get());
  ext_keep_[b] = std::move(mem);
  return ext_[b];
}

// Binds a pooled group to a zeroed pool buffer for this window (allocating one if none is
// free: the pool grows to the most groups one window uses).
float* GradBuffers::group_base(int g) {
  if (slot_of_group_[g] < 0) {
    int slot;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      slot = static_cast<int>(pool_.size());
      pool_.push_back(comm_.allocate(pool_elems_ * sizeof(float)));
    }
    comm_.zero(pool_[slot].get(), pool_elems_ * sizeof(float));
    slot_of_group_[g] = slot;
  }
  return static_cast<float*>(pool_[slot_of_group_[g]].get());
}

void GradBuffers::zero_unwritten(int b, const std::vector<uint8_t>& seen) {
  const Bucket& bucket = plan_.buckets[b];
  if (mode(bucket.group) != GradMemory::overwrite || !stale_[b]) return;
  float* base = bucket_ptr(b);
  size_t i = 0;
  while (i < bucket.params.size()) {
    if (seen[bucket.params[i]]) {
      ++i;
      continue;
    }
    const size_t begin = bucket.offsets[i];
    size_t end = begin;
    while (i < bucket.params.size() && !seen[bucket.params[i]]) end += plan_.params[bucket.params[i++]].numel;
    comm_.zero(base + begin, (end - begin) * sizeof(float));
  }
}

void GradBuffers::hand_over(int b, float* data, std::shared_ptr<void> keep) {
  release_held(false);  // the caller has consumed (waited for) the buckets launched before
  ext_[b] = data;
  ext_keep_[b] = std::move(keep);
  hold_bytes(static_cast<int64_t>(bucket_bytes(b)));
}

std::shared_ptr<void> GradBuffers::hold_until_done(int b, WorkPtr work) {
  std::shared_ptr<void> keep = std::move(ext_keep_[b]);
  held_.push_back({std::move(work), bucket_bytes(b), keep});
  ext_[b] = nullptr;
  return keep;
}

void GradBuffers::hold_bytes(int64_t bytes) {
  held_bytes_ += bytes;
  stats_.streamed_bytes_peak = std::max(stats_.streamed_bytes_peak, held_bytes_);
}

void GradBuffers::release_held(bool all) {
  held_.erase(std::remove_if(held_.begin(), held_.end(),
                             [&](const Held& h) {
                               if (!all && !h.work->is_completed()) return false;
                               held_bytes_ -= static_cast<int64_t>(h.bytes);
                               return true;
                             }),
              held_.end());
}

}  // namespace thetad::comm::engine_detail
