// NodeMemory (comm/node_memory.hpp) as real MPI processes: each node's ranks see one segment,
// allocated by one of them; the node's agreements are its own; a segment can be freed and
// allocated again; and, last (it stays so for the process), memory abandoned by a job about to be
// aborted is not freed collectively: a rank's destruction does not wait for the node's others.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

#include "comm/backends.hpp"
#include "comm/control_plane.hpp"
#include "comm/node_memory.hpp"
#include "comm/node_split.hpp"

namespace thetad::comm {
namespace {

TEST(NodeMemory, OneSegmentPerNodeSeenByEveryRank) {
  auto node = make_node_memory();
  ASSERT_GE(node->local_size(), 1);
  ASSERT_LT(node->local_rank(), node->local_size());
  // The node's plane counts the node's ranks only.
  EXPECT_EQ(node->plane().size(), node->local_size());
  EXPECT_EQ(node->plane().rank(), node->local_rank());
  const NodePlace place = node_place();

  constexpr size_t kBytes = 3 * NodeMemory::kSegmentAlign + 123;
  char* base = node->allocate(kBytes);
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % NodeMemory::kSegmentAlign, 0u);
  // Local rank 0 allocated it all (with the alignment's slack), the others nothing.
  const int64_t here = static_cast<int64_t>(node->allocated_here());
  if (node->local_rank() == 0) {
    EXPECT_GE(here, static_cast<int64_t>(kBytes));
  } else {
    EXPECT_EQ(here, 0);
  }

  // Each rank writes its own byte; after the node's barrier every rank reads all of them, and the
  // node's index (the same on the node, different on another) where local rank 0 put it.
  if (node->local_rank() == 0) std::memcpy(base + kBytes - sizeof(int), &place.node, sizeof(int));
  base[node->local_rank()] = static_cast<char>(1 + node->local_rank());
  node->plane().barrier({"written"});
  for (int r = 0; r < node->local_size(); ++r) EXPECT_EQ(base[r], static_cast<char>(1 + r)) << r;
  int seen = -1;
  std::memcpy(&seen, base + kBytes - sizeof(int), sizeof(int));
  EXPECT_EQ(seen, place.node);
  node->plane().barrier({"read"});
}

TEST(NodeMemory, ReleasedSegmentIsAllocatedAgainZeroed) {
  auto node = make_node_memory();
  char* first = node->allocate(4096);
  ASSERT_NE(first, nullptr);
  first[node->local_rank()] = 7;
  node->plane().barrier({"written"});
  node->release();
  EXPECT_EQ(node->allocated_here(), 0u);
  char* again = node->allocate(8192);
  ASSERT_NE(again, nullptr);
  for (int r = 0; r < node->local_size(); ++r) EXPECT_EQ(again[r], 0) << r;
  node->plane().barrier({"read"});
}

// Last: abandon_node_memory() holds for the rest of the process. Local rank 0 comes to the free
// a second late; the others must not wait for it (a collective free would).
TEST(NodeMemory, AbandonedSegmentIsNotFreedCollectively) {
  ControlPlane world(make_mpi_communicator());
  auto node = make_node_memory();
  ASSERT_NE(node->allocate(4096), nullptr);
  const bool late = node->local_rank() == 0;
  const bool alone = node->local_size() == 1;
  world.barrier({"allocated"});
  abandon_node_memory();
  EXPECT_TRUE(node_memory_abandoned());
  if (late) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const auto t0 = std::chrono::steady_clock::now();
  node.reset();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!late && !alone) {
    EXPECT_LT(s, 1.0) << "the destruction waited for the node's late rank";
  }
  world.barrier({"destroyed"});
}

}  // namespace
}  // namespace thetad::comm
