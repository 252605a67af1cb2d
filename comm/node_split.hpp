// Which ranks form a node: the one place the job's ranks are split into nodes (hosts). Every
// per-node thing (the host arena and its group owners, pinning, the local rank that picks the
// GPU, the CPU share of the owner's threads) follows this split.
//
// A testing aid: THETAD_SIMULATE_NODES=N (set by `thetad-launch --simulate-nodes N`) makes one
// host look like N nodes: the world's ranks are cut into N contiguous blocks of size/N ranks,
// each block a node (intersected with the real hosts, so a node always shares memory). Unset or
// empty: nodes are the hosts (MPI_COMM_TYPE_SHARED). No other code reads the variable.
#pragma once

#include <string>

namespace thetad::comm {

inline constexpr const char* kSimulateNodesEnv = "THETAD_SIMULATE_NODES";

// N from THETAD_SIMULATE_NODES, checked against the world size: 0 when unset or empty;
// ConfigError (exit 2) unless 1 <= N <= world_size and world_size % N == 0.
int simulated_nodes(int world_size);

// The node as a communicator (split_node) is for comm/'s MPI code: comm/mpi/node_comm.hpp.

struct NodePlace {
  int node = 0;   // 0-based index of the node, ordered by the lowest world rank on each
  int nodes = 1;  // how many nodes the job has
  bool simulated = false;
};
// Where the caller's node stands among the job's nodes. Collective over MPI_COMM_WORLD.
NodePlace node_place();

// The name NCCL should give the caller's host (NCCL_HOSTID): empty unless nodes are simulated;
// then the host's own id (NCCL_HOSTID as set, else the host name) with "/simulated-node-K"
// appended, K the caller's node. NCCL groups ranks into hosts by this id: with it, simulated
// nodes talk over NCCL's network transport as real nodes do, and two of them may share a GPU
// (a one-GPU machine runs 2 nodes x 1 GPU); without it NCCL sees one host and refuses two ranks
// on one GPU. Local, no communication.
std::string simulated_nccl_host_id();

// How many ranks of the caller's host (the real one: MPI_COMM_TYPE_SHARED, simulated nodes or
// not) named the same `device_key` (a GPU's PCI bus id), the caller included. More than one when
// simulated nodes outnumber the GPUs, or ranks the GPUs: each such rank may then size what it
// takes from the device's free memory as its share. Collective over MPI_COMM_WORLD.
int ranks_sharing_device(const std::string& device_key);

}  // namespace thetad::comm
