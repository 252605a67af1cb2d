// A frozen model's layers in host memory, brought onto the device layer by layer (a
// transformer's frozen base with offload.shared: stream or model.base_shard: node). Each layer is a few parts (its GEMMs'
// matrices, as raw bytes in the dtype the model reads them in); all layers live in one segment of
// memory shared by the node's ranks (comm/node_memory.hpp: one copy per host, however many ranks
// it runs), pinned where the device pins, each layer page-aligned and pinned as a range of its own
// (a CUDA copy may not span two registered ranges).
//
// The device holds `prefetch + 2` slots of the largest layer. A pass walks the layers in one
// direction (forward: 0, 1, ...; backward: the reverse); acquire(layer, direction) returns the
// layer's slot, copying it in on the H2D stream if it is not there (the compute stream waits for
// the copy, the host does not), and starts the copies of the next `prefetch` layers in that
// direction into slots nobody holds, so that they overlap the layer's compute. release(layer)
// frees its slot for reuse once the compute queued so far is done (a fence, not a wait). Nothing
// here synchronizes the device; with HostDevice (CPU) copies are plain memcpy and finish at once.
//
//   FrozenLayers base(make_node_memory(timeout), {{q_bytes, o_bytes, ...}, ...}, device, 1, limit);
//   base.fill([&](int layer, int part, char* dst) { ...write the part's bytes... });
//   char* slot = base.acquire(i, +1);  ... GEMMs on slot + base.part_offset(i, k) ...  base.release(i);
//
// Where a layer comes from (LayerSource): `host`, copied from the pinned host segment over PCIe;
// `node_shards`, gathered from the node's devices, each of which holds 1/N of every layer
// (node_shards.hpp: rank r bytes [r c, (r+1) c) of a layer of B bytes, c = B / N rounded up to
// 256), read one-sided over NVLink; the host segment then is only read by checkpoints, the hash
// and exports, and is not pinned.
//
// Construction, fill and destruction are collective over the node's ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/node_memory.hpp"
#include "offload/device.hpp"
#include "offload/node_shards.hpp"

namespace thetad::offload {

struct FrozenLayersStats {
  uint64_t copies = 0;        // layers copied onto the device
  uint64_t copied_bytes = 0;  // their bytes
  uint64_t misses = 0;        // acquires that found their layer neither there nor on its way
};

enum class LayerSource { host, node_shards };

class FrozenLayers {
 public:
  // parts[layer][k]: the bytes of part k of a layer. Throws ConfigError where the segment is over
  // host_limit_bytes (> 0) or the host's available memory, or cannot be allocated, pinned, or its
  // slots allocated on the device.
  FrozenLayers(std::unique_ptr<comm::NodeMemory> node, std::vector<std::vector<size_t>> parts, Device& device,
               int prefetch, size_t host_limit_bytes, LayerSource source = LayerSource::host);
  ~FrozenLayers();
  FrozenLayers(const FrozenLayers&) = delete;
  FrozenLayers& operator=(const FrozenLayers&) = delete;

  // Bytes of host memory the layers take (what the constructor allocates), and of device memory.
  static size_t host_bytes(const std::vector<std::vector<size_t>>& parts);
  static size_t device_bytes(const std::vector<std::vector<size_t>>& parts, int prefetch);
  // Bytes of this rank's shard with LayerSource::node_shards over `ranks` ranks (on top of the slots).
  static size_t shard_bytes(const std::vector<std::vector<size_t>>& parts, int ranks);
  bool sharded() const { return shards_ != nullptr; }

  // Collective over the node: each layer's owner (layer % local ranks) writes its parts' bytes,
  // layers in parallel on its threads (write must be thread-safe); the others then see them.
  void fill(const std::function<void(int layer, int part, char* dst)>& write);

  int layers() const { return static_cast<int>(parts_.size()); }
  size_t part_offset(int layer, int part) const { return offset_[static_cast<size_t>(layer)][static_cast<size_t>(part)]; }
  // The part's bytes in host memory (read-only after fill: checkpoints, the hash, exports).
  const char* host_part(int layer, int part) const { return host_ + layer_start_[static_cast<size_t>(layer)] + part_offset(layer, part); }

  // The layer's slot on the device (parts at part_offset), held until as many release(layer) as
  // acquires; the copies of the next `prefetch` layers in `direction` (+1 or -1) started.
  char* acquire(int layer, int direction);
  void release(int layer);

  FrozenLayersStats stats() const { return stats_; }

 private:
  int slot_of(int layer) const { return slot_of_[static_cast<size_t>(layer)]; }
  // A slot for `layer` that no held or soon-needed layer occupies (-1: none), the copy queued.
  int copy_in(int layer, int direction, int needed_from);
  bool soon(int layer, int from, int direction) const;
  // The copies that bring `layer` into slot s once `after` is done; the last one's completion.
  Fence bring(int layer, size_t s, const Fence& after);
  // Rank r's bytes of `layer` (node_shards): at r x chunk_ in the layer.
  size_t shard_part(int layer, int r) const;

  std::unique_ptr<comm::NodeMemory> node_;
  std::vector<std::vector<size_t>> parts_;
  Device& device_;
  int prefetch_;
  std::vector<std::vector<size_t>> offset_;  // per layer, per part: offset in the layer
  std::vector<size_t> layer_start_, layer_bytes_;
  char* host_ = nullptr;
  size_t total_ = 0;
  std::vector<void*> pinned_;
  // The device's slots: which layer each holds (-1: none), its memory, the fence after which its
  // previous contents are no longer read, and the fence of its last copy.
  std::vector<int> slot_layer_;
  std::vector<char*> slot_mem_;
  std::vector<Fence> slot_free_, slot_copied_;
  std::vector<int> slot_of_;  // per layer: its slot (-1: none)
  std::vector<int> held_;     // per layer: acquires not yet released
  FrozenLayersStats stats_;
  // LayerSource::node_shards: the node's shards, and per layer its chunk and start in a shard.
  std::unique_ptr<NodeShards> shards_;
  std::vector<size_t> chunk_, shard_start_;
};

}  // namespace thetad::offload
