// Memory shared by the ranks of a node (node_split.hpp: a host, or a simulated node): one segment
// that the node's first rank allocates and every rank of the node maps, so that a host holds one
// copy of what its ranks share (the host store's arena) however many ranks it runs. With it come
// the node's own agreements (a ControlPlane over its ranks), so that its users never reach for
// the backend: the segment's creation and its free are collectives without a nonblocking form,
// and the bounded agreements around them are what turns a rank that never comes into a
// TimeoutError instead of a hang.
//
//   std::unique_ptr<NodeMemory> node = make_node_memory(timeout);   // collective over the job's ranks
//   int64_t avail = node->plane().broadcast(..., 0, {"what"});        // agreements of the node's ranks
//   char* base = node->allocate(bytes);                               // collective over the node
//   ... every rank of the node reads and writes [base, base + bytes) ...
//   node.reset();                                                      // collective: frees the segment
//
// A process whose job is about to be aborted leaves the segment to its exit instead
// (abandon_node_memory): the collective free would wait for ranks that failed elsewhere.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "comm/communicator.hpp"

namespace thetad::comm {

class ControlPlane;

class NodeMemory {
 public:
  // The segment's start is aligned to this (a page), on every rank.
  static constexpr size_t kSegmentAlign = 4096;

  virtual ~NodeMemory() = default;
  // This rank among the node's ranks (0..local_size()-1, in the order of the job's ranks).
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  // Agreements and barriers of the node's ranks, each bounded by the timeout the node was made with.
  virtual ControlPlane& plane() = 0;
  // Collective over the node: a segment of `bytes`, allocated by local rank 0 and mapped by every
  // rank of the node, zero-filled; its start on this rank (kSegmentAlign-aligned). Null where the
  // node cannot allocate it (the caller says what it was for). One segment at a time.
  virtual char* allocate(size_t bytes) = 0;
  // What this rank itself allocated for the segment (local rank 0: the segment and its alignment
  // slack; the others: 0).
  virtual size_t allocated_here() const = 0;
  // Collective over the node: frees the segment (nothing where there is none). After
  // abandon_node_memory() the segment is left to the process's exit instead.
  virtual void release() noexcept = 0;
};

// The caller's node among the job's ranks (split_node over the world), its agreements bounded by
// `timeout`. Collective over the job's ranks. (comm/mpi/mpi_node_memory.cpp)
std::unique_ptr<NodeMemory> make_node_memory(std::chrono::milliseconds timeout = kDefaultTimeout);

// A process about to abort its job: node memory released from now on (and its node's
// communicator) is left to the process's exit, since the collective free may wait for ranks that
// failed elsewhere and never join it. Local; never throws.
void abandon_node_memory() noexcept;
bool node_memory_abandoned() noexcept;

}  // namespace thetad::comm
