// One host-resident arena per node, shared by all ranks of that node: the node's shared memory
// (comm/node_memory.hpp; a node: a host, or a simulated node) holding, per offloaded group, fp32
// parameters, Adam m and v, and a landing area for the reduced gradient, plus one sequence number
// per group; with bf16_params, also the parameters rounded to bfloat16 (what a bf16 job copies to
// the device).
//
// The node's local rank 0 allocates the whole segment and every rank maps it, so a host holds one
// copy of θ however many ranks it runs. Given a Device that pins (CudaDevice), every rank
// page-locks the segment at construction, in chunks of at most kPinChunkBytes, and unpins it on
// destruction; never later.
//
// Ordering: the group's owner (node-local rank group % local_size) bumps seq(i) with release
// semantics after writing the group's parameters; readers load it with acquire semantics and
// wait until it reaches the count they expect (every rank knows how many updates happened).
//
//   HostArena arena(comm::make_node_memory(timeout), {{1, n1}, {2, n2}}, host_limit_bytes, &device);
//   if (arena.is_owner(0)) { write arena.params(0) ...; arena.publish(0); }
//   arena.wait_seq(0, expected, timeout_s);  read arena.params(0) ...
//
// Construction and destruction are collective over the node's ranks.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/node_memory.hpp"

namespace thetad::offload {

class Device;

struct ArenaEntry {
  int group;     // group id (>= 1)
  size_t numel;  // fp32 elements
};

class HostArena {
 public:
  static constexpr size_t kAlign = 64;
  static constexpr size_t kPinChunkBytes = size_t{1} << 30;

  // Throws ConfigError when the arena exceeds host_limit_bytes (> 0) or the host's
  // MemAvailable, or cannot be allocated or pinned. pinner may be null (no pinning). Every
  // agreement and barrier of the host's ranks is the node's (bounded by its timeout:
  // TimeoutError naming it).
  HostArena(std::unique_ptr<comm::NodeMemory> node, std::vector<ArenaEntry> entries, size_t host_limit_bytes,
            Device* pinner, bool bf16_params = false);
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  // Bytes the arena needs for these entries (what the constructor will ask for).
  static size_t required_bytes(const std::vector<ArenaEntry>& entries, bool bf16_params = false);

  size_t entries() const { return entries_.size(); }
  const ArenaEntry& entry(size_t i) const { return entries_[i]; }

  float* params(size_t i) const { return ptr(i, 0); }
  float* exp_avg(size_t i) const { return ptr(i, 1); }
  float* exp_avg_sq(size_t i) const { return ptr(i, 2); }
  float* grad(size_t i) const { return ptr(i, 3); }
  // The bfloat16 copy of params(i), kept by its writers (null without bf16_params).
  uint16_t* params_bf16(size_t i) const {
    return bf16_params_ ? reinterpret_cast<uint16_t*>(ptr(i, 4)) : nullptr;
  }
  // Owner side: rewrites params_bf16(i) from params(i) after a write other than the CPU AdamW's
  // (initial values, resume, a device flush); nothing without bf16_params.
  void refresh_bf16(size_t i) const;
  std::atomic<uint64_t>& seq(size_t i) const;

  // Owner side: makes the group's writes visible and bumps its sequence number.
  void publish(size_t i) const;
  // Reader side: waits until seq(i) >= expected; TimeoutError after timeout_s. `poll` (if any)
  // runs while it waits and may throw (the owner's own optimizer thread failed).
  void wait_seq(size_t i, uint64_t expected, double timeout_s,
                const std::function<void()>& poll = {}) const;
  bool seq_reached(size_t i, uint64_t expected) const;

  int owner(size_t i) const { return entries_[i].group % local_size(); }
  bool is_owner(size_t i) const { return owner(i) == local_rank(); }

  int local_rank() const { return node_->local_rank(); }
  int local_size() const { return node_->local_size(); }
  // A barrier of the host's ranks with full memory fences on both sides (writes before it on
  // one rank are seen after it on the others); `what` names it in a TimeoutError.
  void node_barrier(const std::string& what) const;

  // Size of the shared segment (one per host): host_pinned_bytes.
  size_t bytes() const { return total_; }
  // What this rank itself allocated for the segment (local rank 0: bytes() and a page; others: 0).
  size_t local_alloc_bytes() const { return node_->allocated_here(); }
  // Start of the segment; pinned chunks start at base() + k * kPinChunkBytes.
  const char* base() const { return base_; }
  bool pinned() const { return !pinned_chunks_.empty(); }

 private:
  float* ptr(size_t i, int which) const;
  void unpin() noexcept;

  std::vector<ArenaEntry> entries_;
  std::vector<size_t> offset_;  // per entry: start of its 4 buffers
  std::vector<size_t> stride_;  // per entry: bytes of one fp32 buffer (rounded to kAlign)
  bool bf16_params_ = false;     // a fifth buffer per entry, after the four: params in bf16
  size_t header_ = 0;
  size_t total_ = 0;
  std::unique_ptr<comm::NodeMemory> node_;  // the node's ranks, agreements and segment
  char* base_ = nullptr;
  Device* pinner_ = nullptr;
  std::vector<void*> pinned_chunks_;
};

}  // namespace thetad::offload
