// The node's device buffers, each readable by every rank of the node (see node_shards.hpp).
#include "offload/node_shards.hpp"

#include <algorithm>
#include <exception>
#include <string>

#include "comm/control_plane.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "offload/util.hpp"

namespace thetad::offload {

NodeShards::NodeShards(Device& device, size_t bytes_each, std::chrono::milliseconds timeout)
    : device_(device), node_(comm::make_node_memory(timeout)) {
  const int ranks = node_->local_size();
  shard_.assign(static_cast<size_t>(ranks), nullptr);
  if (device_.is_host()) {
    char* base = node_->allocate(bytes_each * static_cast<size_t>(ranks));
    if (base == nullptr)
      throw ConfigError(::thetad::detail::concat("model.base_shard: node: cannot allocate the shards' ",
                                                 mib(bytes_each * static_cast<size_t>(ranks)),
                                                 " MiB as memory shared by the host's ranks"));
    for (int r = 0; r < ranks; ++r) shard_[static_cast<size_t>(r)] = base + bytes_each * static_cast<size_t>(r);
    return;
  }
  // Each rank's own buffer, its handle sent to the node's others; any failure fails the node alike.
  std::string handle, error;
  try {
    own_ = static_cast<char*>(device_.alloc(std::max<size_t>(bytes_each, 1)));
    handle = device_.share(own_);
  } catch (const std::exception& e) {
    error = e.what();
  }
  comm::ControlPlane& plane = node_->plane();
  if (!plane.all_ok(error.empty(), {"sharded base: the shards allocated"})) {
    device_.free(own_);
    throw ConfigError(error.empty() ? "model.base_shard: node: another rank of this node could not allocate its shard"
                                    : error);
  }
  for (int r = 0; r < ranks; ++r) {
    const std::string theirs = plane.broadcast(r == local_rank() ? handle : std::string(), r,
                                               {"sharded base: a shard's handle"});
    if (r == local_rank()) {
      shard_[static_cast<size_t>(r)] = own_;
      continue;
    }
    try {
      if (error.empty()) shard_[static_cast<size_t>(r)] = static_cast<char*>(device_.open_shared(theirs));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!plane.all_ok(error.empty(), {"sharded base: the shards mapped"})) {
    for (int r = 0; r < ranks; ++r)
      if (r != local_rank()) device_.close_shared(shard_[static_cast<size_t>(r)]);
    device_.free(own_);
    throw ConfigError(error.empty() ? "model.base_shard: node: another rank of this node could not map the shards"
                                    : error);
  }
}

NodeShards::~NodeShards() {
  // A job that aborts leaves the buffers to the process's exit: the barrier would wait for ranks
  // that failed elsewhere.
  if (comm::node_memory_abandoned()) return;
  try {
    node_->plane().barrier({"sharded base: every rank's reads done"});
  } catch (const std::exception& e) {
    THETAD_LOG(warn, "offload") << "sharded base: the node's ranks did not meet before freeing the shards ("
                                << e.what() << "); freeing this rank's anyway";
  }
  for (int r = 0; r < static_cast<int>(shard_.size()); ++r)
    if (r != local_rank() && !device_.is_host()) device_.close_shared(shard_[static_cast<size_t>(r)]);
  device_.free(own_);
}

}  // namespace thetad::offload
