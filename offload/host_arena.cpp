// The per-host shared arena (see host_arena.hpp): size check, the node's shared segment, pinning.
#include "offload/host_arena.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <fstream>
#include <iomanip>
#include <new>
#include <sstream>
#include <string>
#include <thread>

#include "comm/control_plane.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/thread_pool.hpp"
#include "offload/cpu_adam.hpp"
#include "offload/device.hpp"
#include "offload/meminfo.hpp"
#include "offload/util.hpp"

namespace thetad::offload {
namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "sequence numbers in shared memory need lock-free 64-bit atomics");

constexpr size_t kPage = comm::NodeMemory::kSegmentAlign;

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// The most threads that fault in, pin and unpin the arena's pages (within the rank's CPU share).
constexpr size_t kArenaThreads = 8;

// Runs fn(i) for i in [0, n) on up to `threads` threads of the process's pool, idle while the
// arena is built and freed (the update queue starts after it and stops before); the first
// exception is rethrown.
void parallel_over(size_t n, size_t threads, const std::function<void(size_t)>& fn) {
  ThreadPool::instance().parallel_for(n, fn, threads);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One group's buffers: params | m | v | grad, each 64-byte aligned, then (bf16_params) the
// parameters in bfloat16.
size_t group_bytes(size_t numel, size_t stride, bool bf16_params) {
  return 4 * stride + (bf16_params ? round_up(numel * sizeof(uint16_t), HostArena::kAlign) : 0);
}

}  // namespace

uint64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

size_t HostArena::required_bytes(const std::vector<ArenaEntry>& entries, bool bf16_params) {
  size_t total = round_up(entries.size() * kAlign, kPage);
  for (const auto& e : entries)
    total += round_up(group_bytes(e.numel, round_up(e.numel * sizeof(float), kAlign), bf16_params), kPage);
  return total;
}

HostArena::HostArena(std::unique_ptr<comm::NodeMemory> node, std::vector<ArenaEntry> entries,
                     size_t host_limit_bytes, Device* pinner, bool bf16_params)
    : entries_(std::move(entries)), bf16_params_(bf16_params), node_(std::move(node)), pinner_(pinner) {
  // Layout: one cache line per sequence number (no false sharing between owners), then each
  // group's params | m | v | grad, every buffer 64-byte aligned and every group page-aligned:
  // pinned chunks are cut at group boundaries, because a CUDA copy may not span two
  // cudaHostRegister'ed ranges (it fails with "invalid argument").
  header_ = round_up(entries_.size() * kAlign, kPage);
  size_t off = header_;
  size_t params = 0;
  for (const auto& e : entries_) {
    THETAD_CHECK(e.group >= 1, InternalError, "group ", e.group,
                 " cannot live in the host arena (group 0, the shared Θ, is never offloaded)");
    offset_.push_back(off);
    stride_.push_back(round_up(e.numel * sizeof(float), kAlign));
    off = round_up(off + group_bytes(e.numel, stride_.back(), bf16_params_), kPage);
    params += e.numel;
  }
  total_ = round_up(off, kPage);

  comm::ControlPlane& plane = node_->plane();  // the host's agreements and barriers, bounded
  const int local_rank = node_->local_rank(), local_size = node_->local_size();

  // One reading of MemAvailable, taken by local rank 0, so all ranks decide alike.
  const auto avail = static_cast<uint64_t>(plane.broadcast(
      local_rank == 0 ? static_cast<int64_t>(mem_available_bytes()) : 0, 0,
      {"host arena: the reading of MemAvailable"}));
  const bool over_limit = host_limit_bytes > 0 && total_ > host_limit_bytes;
  const bool over_mem = avail > 0 && total_ > avail;
  if (over_limit || over_mem) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(1);
    os << "offload: the host arena needs " << mib(total_) << " MiB (" << entries_.size()
       << " offloaded groups, " << params
       << " parameters x 16 bytes for fp32 params, Adam m, v and the gradient landing area) but ";
    if (over_limit)
      os << "offload.host_limit_mb is " << mib(host_limit_bytes) << " MiB";
    else
      os << "the host has only " << mib(avail) << " MiB available (MemAvailable)";
    os << ". Offload fewer or smaller task groups (offload.enabled: false keeps them on the device)"
          ", raise offload.host_limit_mb, hold only the groups the job's schedule uses "
          "(offload.host_groups: scheduled), or run fewer tasks per job";
    throw ConfigError(os.str());
  }

  // Local rank 0 allocates everything; the others map its segment, page-aligned (the chunked
  // pinning needs it).
  base_ = node_->allocate(total_);
  if (base_ == nullptr)
    throw ConfigError(::thetad::detail::concat("offload: cannot allocate the ", mib(total_),
                                     " MiB host arena as memory shared by the host's ranks (an MPI "
                                     "shared window); offload fewer groups or lower offload.host_limit_mb"));

  if (local_rank == 0) {
    for (size_t i = 0; i < entries_.size(); ++i)
      new (base_ + i * kAlign) std::atomic<uint64_t>(0);
  }

  // Every rank pins its own mapping. A failure anywhere on the node fails everyone alike, so
  // no rank is left waiting in a collective the others skipped.
  int ok = 1;
  std::string pin_error;
  double touch_s = 0, pin_s = 0;
  if (pinner_ != nullptr && !pinner_->is_host()) {
    // Chunks of up to kPinChunkBytes of whole groups (a larger group is a chunk of its own).
    std::vector<std::pair<size_t, size_t>> chunks;
    size_t start = 0;
    for (size_t i = 0; i < entries_.size(); ++i) {
      const size_t end = i + 1 < entries_.size() ? offset_[i + 1] : total_;
      if (end - start > kPinChunkBytes && offset_[i] > start) {
        chunks.emplace_back(start, offset_[i]);
        start = offset_[i];
      }
    }
    if (total_ > start) chunks.emplace_back(start, total_);
    // The window's pages are not backed yet: the host's ranks fault them in together, each
    // its share on several threads (a single thread faults ~10 GB/s; an arena can be 100+ GB),
    // then every rank pins the chunks on several threads.
    const size_t threads = std::min<size_t>(kArenaThreads, cpu_share(local_size));
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<size_t> mine;
    for (size_t c = static_cast<size_t>(local_rank); c < chunks.size(); c += static_cast<size_t>(local_size))
      mine.push_back(c);
    parallel_over(mine.size(), threads, [&](size_t k) {
      const auto [from, to] = chunks[mine[k]];
      const size_t lo = std::max(from, header_);
      if (lo >= to) return;
#ifdef MADV_POPULATE_WRITE
      // Linux >= 5.14 faults the range in inside the kernel, without a trap per page.
      if (madvise(base_ + lo, to - lo, MADV_POPULATE_WRITE) == 0) return;
#endif
      for (size_t off = lo; off < to; off += kPage)
        base_[off] = 0;  // a fresh window reads as zeros: writing one keeps it so
    });
    node_barrier("host arena: pages faulted in");
    touch_s = seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    std::vector<char*> done(chunks.size(), nullptr);
    try {
      parallel_over(chunks.size(), threads, [&](size_t c) {
        pinner_->pin_host(base_ + chunks[c].first, chunks[c].second - chunks[c].first);
        done[c] = base_ + chunks[c].first;
      });
    } catch (const std::exception& e) {
      ok = 0;
      pin_error = e.what();
    }
    for (char* p : done)
      if (p) pinned_chunks_.push_back(p);
    pin_s = seconds_since(t1);
  }
  if (!plane.all_ok(ok, {"host arena: the pinning agreement"})) {
    for (void* p : pinned_chunks_) pinner_->unpin_host(p);
    pinned_chunks_.clear();
    throw ConfigError(pin_error.empty() ? "offload: another rank of this host could not pin the "
                                          "host arena"
                                        : pin_error);
  }
  node_barrier("host arena: sequence numbers constructed");  // before anyone reads them
  THETAD_LOG(info, "offload") << "host arena: " << mib(total_) << " MiB for " << entries_.size()
                              << " groups shared by " << local_size << " local ranks"
                              << " (this is node-local rank " << local_rank << ")"
                              << (pinned() ? ", pinned" : ", not pinned") << std::fixed
                              << std::setprecision(2) << " (pages faulted in " << touch_s
                              << " s, pinned in " << pin_s << " s)";
}

HostArena::~HostArena() {
  if (comm::node_memory_abandoned()) {
    // The job is aborting: the segment goes with the process (node_'s destructor leaves it), and
    // so do its pages' pinning, which a driver in a failed state may not undo.
    THETAD_LOG(warn, "offload") << "host arena left to the process's exit (the job is aborting)";
    return;
  }
  unpin();
}  // node_: the collective free of the segment

void HostArena::unpin() noexcept {
  if (pinned_chunks_.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    parallel_over(pinned_chunks_.size(), kArenaThreads, [&](size_t c) { pinner_->unpin_host(pinned_chunks_[c]); });
  } catch (...) {  // one that failed: the others one at a time (unpinning twice is harmless)
    for (void* p : pinned_chunks_) {
      try {
        pinner_->unpin_host(p);
      } catch (...) {
      }
    }
  }
  THETAD_LOG(info, "offload") << "host arena unpinned in " << seconds_since(t0) << " s";
}

void HostArena::refresh_bf16(size_t i) const {
  if (bf16_params_) round_to_bf16(params(i), params_bf16(i), entries_[i].numel);
}

float* HostArena::ptr(size_t i, int which) const {
  return reinterpret_cast<float*>(base_ + offset_[i] + static_cast<size_t>(which) * stride_[i]);
}

std::atomic<uint64_t>& HostArena::seq(size_t i) const {
  return *std::launder(reinterpret_cast<std::atomic<uint64_t>*>(base_ + i * kAlign));
}

void HostArena::publish(size_t i) const { seq(i).fetch_add(1, std::memory_order_release); }

bool HostArena::seq_reached(size_t i, uint64_t expected) const {
  return seq(i).load(std::memory_order_acquire) >= expected;
}

void HostArena::wait_seq(size_t i, uint64_t expected, double timeout_s,
                         const std::function<void()>& poll) const {
  // Updates take milliseconds: the wait backs off to leave the cores to the owner's threads.
  wait_until([&] { return seq_reached(i, expected); }, timeout_s,
             [&] {
               return ::thetad::detail::concat("group ", entries_[i].group, " to reach update ", expected,
                                     " (at ", seq(i).load(), "); its owner, local rank ", owner(i),
                                     ", did not finish its optimizer step");
             },
             poll);
}

// Full fences on both sides: memory written before it on one rank of the host is seen after it
// on the others.
void HostArena::node_barrier(const std::string& what) const {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  node_->plane().barrier({what});
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

}  // namespace thetad::offload
