// A frozen model's layers streamed from host memory (see frozen_layers.hpp).
#include "offload/frozen_layers.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <string>

#include "comm/control_plane.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/thread_pool.hpp"
#include "offload/meminfo.hpp"
#include "offload/util.hpp"

namespace thetad::offload {
namespace {

constexpr size_t kPage = comm::NodeMemory::kSegmentAlign;
constexpr size_t kPartAlign = 256;  // a part's start: what a GEMM's operand wants
constexpr size_t kPinThreads = 8;   // cudaHostRegister runs ~2 GB/s a thread

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

size_t layer_bytes(const std::vector<size_t>& parts) {
  size_t n = 0;
  for (size_t b : parts) n = round_up(n, kPartAlign) + b;
  return n;
}

// A layer's bytes held by each of `ranks` shards (the last may hold fewer).
size_t chunk_of(size_t layer_bytes, int ranks) {
  const auto n = static_cast<size_t>(std::max(1, ranks));
  return round_up((layer_bytes + n - 1) / n, kPartAlign);
}

}  // namespace

size_t FrozenLayers::host_bytes(const std::vector<std::vector<size_t>>& parts) {
  size_t n = 0;
  for (const auto& l : parts) n += round_up(layer_bytes(l), kPage);
  return n;
}

size_t FrozenLayers::device_bytes(const std::vector<std::vector<size_t>>& parts, int prefetch) {
  size_t largest = 0;
  for (const auto& l : parts) largest = std::max(largest, layer_bytes(l));
  return largest * static_cast<size_t>(prefetch + 2);
}

size_t FrozenLayers::shard_bytes(const std::vector<std::vector<size_t>>& parts, int ranks) {
  size_t n = 0;
  for (const auto& l : parts) n += chunk_of(layer_bytes(l), ranks);
  return n;
}

FrozenLayers::FrozenLayers(std::unique_ptr<comm::NodeMemory> node, std::vector<std::vector<size_t>> parts,
                           Device& device, int prefetch, size_t host_limit_bytes, LayerSource source)
    : node_(std::move(node)), parts_(std::move(parts)), device_(device), prefetch_(std::max(0, prefetch)) {
  THETAD_CHECK(!parts_.empty(), InternalError, "a frozen base streamed with no layers");
  size_t largest = 0;
  for (const auto& l : parts_) {
    std::vector<size_t> offsets;
    size_t n = 0;
    for (size_t b : l) {
      n = round_up(n, kPartAlign);
      offsets.push_back(n);
      n += b;
    }
    offset_.push_back(std::move(offsets));
    layer_start_.push_back(total_);
    layer_bytes_.push_back(n);
    largest = std::max(largest, n);
    total_ += round_up(n, kPage);
  }
  comm::ControlPlane& plane = node_->plane();
  // One reading of MemAvailable, local rank 0's, so every rank of the node decides alike.
  const auto avail = static_cast<uint64_t>(plane.broadcast(
      node_->local_rank() == 0 ? static_cast<int64_t>(mem_available_bytes()) : 0, 0,
      {"streamed base: the reading of MemAvailable"}));
  if ((host_limit_bytes > 0 && total_ > host_limit_bytes) || (avail > 0 && total_ > avail))
    throw ConfigError(::thetad::detail::concat(
        "offload.shared: stream: the frozen base's ", parts_.size(), " layers need ", mib(total_),
        " MiB of host memory but ",
        host_limit_bytes > 0 && total_ > host_limit_bytes
            ? ::thetad::detail::concat("offload.host_limit_mb is ", mib(host_limit_bytes), " MiB")
            : ::thetad::detail::concat("the host has only ", mib(avail), " MiB available (MemAvailable)"),
        "; hold the base in nf4 (model.base_quant: nf4) or raise offload.host_limit_mb"));
  host_ = node_->allocate(total_);
  if (host_ == nullptr)
    throw ConfigError(::thetad::detail::concat("offload.shared: stream: cannot allocate the frozen base's ",
                                               mib(total_), " MiB as memory shared by the host's ranks"));
  const int slots = prefetch_ + 2;
  try {
    for (int s = 0; s < slots; ++s) slot_mem_.push_back(static_cast<char*>(device_.alloc(std::max<size_t>(largest, 1))));
  } catch (...) {
    for (char* p : slot_mem_) device_.free(p);
    throw;
  }
  slot_layer_.assign(static_cast<size_t>(slots), -1);
  slot_free_.resize(static_cast<size_t>(slots));
  slot_copied_.resize(static_cast<size_t>(slots));
  slot_of_.assign(parts_.size(), -1);
  held_.assign(parts_.size(), 0);
  if (source != LayerSource::node_shards) return;
  const int ranks = node_->local_size();
  size_t shard = 0;
  for (size_t b : layer_bytes_) {
    shard_start_.push_back(shard);
    chunk_.push_back(chunk_of(b, ranks));
    shard += chunk_.back();
  }
  try {
    shards_ = std::make_unique<NodeShards>(device_, shard, plane.timeout());
  } catch (...) {
    for (char* p : slot_mem_) device_.free(p);
    throw;
  }
}

FrozenLayers::~FrozenLayers() {
  // Every gather of this rank done before the node's ranks free the shards it reads.
  if (shards_ && !comm::node_memory_abandoned()) {
    try {
      for (const Fence& f : slot_copied_) device_.host_wait(f);
    } catch (const std::exception& e) {
      THETAD_LOG(warn, "offload") << "sharded base: waiting for the last gathers failed: " << e.what();
    }
  }
  shards_.reset();
  for (char* p : slot_mem_) device_.free(p);
  // A job that aborts leaves the segment and its pinning to the process's exit.
  if (comm::node_memory_abandoned()) return;
  for (void* p : pinned_) device_.unpin_host(p);
}

void FrozenLayers::fill(const std::function<void(int layer, int part, char* dst)>& write) {
  const int local = node_->local_rank(), ranks = node_->local_size();
  std::vector<int> mine;
  for (int l = local; l < layers(); l += ranks) mine.push_back(l);
  ThreadPool::instance().parallel_for(mine.size(), [&](size_t i) {
    const int l = mine[i];
    for (size_t k = 0; k < parts_[static_cast<size_t>(l)].size(); ++k)
      write(l, static_cast<int>(k), host_ + layer_start_[static_cast<size_t>(l)] + offset_[static_cast<size_t>(l)][k]);
  });
  std::atomic_thread_fence(std::memory_order_seq_cst);
  node_->plane().barrier({"streamed base: the layers written"});
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const size_t slot_bytes = *std::max_element(layer_bytes_.begin(), layer_bytes_.end());
  if (shards_) {
    // This rank's part of every layer into its shard; nobody gathers before every shard is written.
    Fence last;
    for (int l = 0; l < layers(); ++l)
      if (const size_t n = shard_part(l, local))
        last = device_.h2d(shards_->mine() + shard_start_[static_cast<size_t>(l)],
                           host_ + layer_start_[static_cast<size_t>(l)] + static_cast<size_t>(local) * chunk_[static_cast<size_t>(l)],
                           n, {});
    device_.host_wait(last);
    shards_->plane().barrier({"sharded base: the shards written"});
    THETAD_LOG(info, "offload") << "sharded base: " << layers() << " layers, 1/" << ranks << " of each on each of "
                                << ranks << " local ranks (" << mib(shard_bytes(parts_, ranks)) << " MiB on "
                                << device_.name() << "), " << slot_mem_.size() << " slots of " << mib(slot_bytes)
                                << " MiB; the whole base in " << mib(total_) << " MiB of host memory shared by them";
    return;
  }
  if (device_.is_host()) {
    THETAD_LOG(info, "offload") << "streamed base: " << layers() << " layers in " << mib(total_)
                                << " MiB of host memory shared by " << ranks << " local ranks, " << slot_mem_.size()
                                << " slots of " << mib(slot_bytes) << " MiB";
    return;
  }
  // Every rank pins its own mapping, a layer a range; a failure anywhere fails the node alike.
  std::vector<void*> done(parts_.size(), nullptr);
  std::string error;
  int ok = 1;
  try {
    ThreadPool::instance().parallel_for(parts_.size(), [&](size_t l) {
      void* p = host_ + layer_start_[l];
      device_.pin_host(p, round_up(layer_bytes_[l], kPage));
      done[l] = p;
    }, kPinThreads);
  } catch (const std::exception& e) {
    ok = 0;
    error = e.what();
  }
  for (void* p : done)
    if (p) pinned_.push_back(p);
  if (!node_->plane().all_ok(ok, {"streamed base: the pinning agreement"}))
    throw ConfigError(error.empty() ? "offload.shared: stream: another rank of this host could not pin the frozen base"
                                    : error);
  THETAD_LOG(info, "offload") << "streamed base: " << layers() << " layers in " << mib(total_)
                              << " MiB of pinned host memory shared by " << ranks << " local ranks, "
                              << slot_mem_.size() << " device slots of " << mib(slot_bytes) << " MiB";
}

bool FrozenLayers::soon(int layer, int from, int direction) const {
  const int ahead = (layer - from) * direction;
  return ahead >= 0 && ahead <= prefetch_;
}

int FrozenLayers::copy_in(int layer, int direction, int needed_from) {
  int best = -1;
  for (size_t s = 0; s < slot_layer_.size(); ++s) {
    const int held_layer = slot_layer_[s];
    if (held_layer < 0) {
      best = static_cast<int>(s);
      break;
    }
    if (held_[static_cast<size_t>(held_layer)] > 0 || soon(held_layer, needed_from, direction)) continue;
    // Of the slots free to take, the one whose layer is farthest behind the walk.
    if (best < 0 || (held_layer - slot_layer_[static_cast<size_t>(best)]) * direction < 0) best = static_cast<int>(s);
  }
  if (best < 0) return -1;
  const size_t s = static_cast<size_t>(best);
  if (slot_layer_[s] >= 0) slot_of_[static_cast<size_t>(slot_layer_[s])] = -1;
  slot_layer_[s] = layer;
  slot_of_[static_cast<size_t>(layer)] = best;
  slot_copied_[s] = bring(layer, s, slot_free_[s]);
  ++stats_.copies;
  stats_.copied_bytes += layer_bytes_[static_cast<size_t>(layer)];
  return best;
}

size_t FrozenLayers::shard_part(int layer, int r) const {
  const size_t l = static_cast<size_t>(layer), start = static_cast<size_t>(r) * chunk_[l];
  return start >= layer_bytes_[l] ? 0 : std::min(chunk_[l], layer_bytes_[l] - start);
}

Fence FrozenLayers::bring(int layer, size_t s, const Fence& after) {
  const size_t l = static_cast<size_t>(layer);
  if (!shards_) return device_.h2d(slot_mem_[s], host_ + layer_start_[l], layer_bytes_[l], after);
  // One copy from each rank's shard, in order on one stream: the first waits for `after`.
  Fence last = after;
  bool first = true;
  for (int r = 0; r < shards_->local_size(); ++r)
    if (const size_t n = shard_part(layer, r)) {
      last = device_.d2d(slot_mem_[s] + static_cast<size_t>(r) * chunk_[l], shards_->of(r) + shard_start_[l], n,
                         first ? after : Fence{});
      first = false;
    }
  return last;
}

char* FrozenLayers::acquire(int layer, int direction) {
  THETAD_CHECK(layer >= 0 && layer < layers(), InternalError, "streamed base: no layer ", layer);
  int s = slot_of(layer);
  if (s < 0) {
    ++stats_.misses;
    s = copy_in(layer, direction, layer);
    THETAD_CHECK(s >= 0, InternalError, "streamed base: every slot held when layer ", layer, " is needed");
  }
  device_.compute_wait(slot_copied_[static_cast<size_t>(s)]);
  ++held_[static_cast<size_t>(layer)];
  for (int k = 1; k <= prefetch_; ++k) {
    const int next = layer + k * direction;
    if (next < 0 || next >= layers()) break;
    if (slot_of(next) < 0 && copy_in(next, direction, layer) < 0) break;
  }
  return slot_mem_[static_cast<size_t>(s)];
}

void FrozenLayers::release(int layer) {
  int& held = held_.at(static_cast<size_t>(layer));
  THETAD_CHECK(held > 0 && slot_of(layer) >= 0, InternalError, "streamed base: layer ", layer, " released unheld");
  --held;
  slot_free_[static_cast<size_t>(slot_of(layer))] = device_.record_compute();
}

}  // namespace thetad::offload
