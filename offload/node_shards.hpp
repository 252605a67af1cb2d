// One buffer per rank of a node in that rank's device memory, each readable by every rank of the
// node: a frozen base sharded over the node's devices (model.base_shard: node) keeps 1/N of every
// layer in each rank's buffer and gathers a layer from all of them into a slot before its use
// (frozen_layers.hpp). The reads are one-sided, so the ranks never have to walk their layers in
// step: a rank that runs more passes than another, or evaluates alone, gathers on its own.
//
// On a GPU each rank's buffer is its own cudaMalloc, mapped into the node's other ranks through
// CUDA IPC (read over NVLink between GPUs, by the copy engines rather than the SMs; as is between
// ranks that share a GPU). On the host device (CPU runs) the buffers are one segment of memory
// shared by the node's ranks (comm/node_memory.hpp), rank r's at r x bytes_each.
//
//   NodeShards shards(device, bytes_each, timeout);   // collective over the job's ranks
//   ... write shards.mine() ...; shards.plane().barrier(...);
//   device.d2d(slot, shards.of(r) + offset, n, after);  // any rank's part, any time
//   ... every read of this rank waited for ...; shards.reset-by-destruction (collective)
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "comm/node_memory.hpp"
#include "offload/device.hpp"

namespace thetad::offload {

class NodeShards {
 public:
  // Collective over the job's ranks (each node's ranks agree among themselves). Throws
  // ConfigError where a buffer cannot be allocated or another rank's cannot be mapped.
  NodeShards(Device& device, size_t bytes_each, std::chrono::milliseconds timeout);
  // Collective over the node: a barrier, so that no rank frees its buffer while another may still
  // read it (each rank waits for its own reads before it comes).
  ~NodeShards();
  NodeShards(const NodeShards&) = delete;
  NodeShards& operator=(const NodeShards&) = delete;

  int local_rank() const { return node_->local_rank(); }
  int local_size() const { return node_->local_size(); }
  comm::ControlPlane& plane() { return node_->plane(); }
  char* mine() const { return shard_[static_cast<size_t>(local_rank())]; }
  // Local rank r's buffer as this rank reads it.
  const char* of(int r) const { return shard_.at(static_cast<size_t>(r)); }

 private:
  Device& device_;
  std::unique_ptr<comm::NodeMemory> node_;  // the node's agreements; on the host also the buffers
  std::vector<char*> shard_;                // per local rank
  char* own_ = nullptr;                     // a GPU's: this rank's cudaMalloc
};

}  // namespace thetad::offload
