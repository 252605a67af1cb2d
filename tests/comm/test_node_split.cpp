// The split of the ranks into nodes (comm/node_split.hpp) under mpirun on one host: the host is
// one node; THETAD_SIMULATE_NODES=N makes N nodes of contiguous world ranks, also for a
// communicator that orders the ranks differently; bad values are a ConfigError on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "comm/mpi/node_comm.hpp"
#include "comm/node_split.hpp"
#include "common/errors.hpp"

namespace {

using thetad::comm::split_node;

struct World {
  int rank = 0, size = 1;
  World() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
};

// Sets THETAD_SIMULATE_NODES for one test (null: unset) and unsets it after.
class SimulateNodes {
 public:
  explicit SimulateNodes(const char* value) {
    if (value) setenv(thetad::comm::kSimulateNodesEnv, value, 1);
    else unsetenv(thetad::comm::kSimulateNodesEnv);
  }
  ~SimulateNodes() { unsetenv(thetad::comm::kSimulateNodesEnv); }
};

// The world ranks of `node`, in its order.
std::vector<int> world_ranks(MPI_Comm node) {
  int size = 0, me = World().rank;
  MPI_Comm_size(node, &size);
  std::vector<int> out(static_cast<size_t>(size));
  MPI_Allgather(&me, 1, MPI_INT, out.data(), 1, MPI_INT, node);
  return out;
}

TEST(NodeSplit, WithoutSimulationTheHostIsOneNode) {
  SimulateNodes env(nullptr);
  const World w;
  MPI_Comm node = split_node(MPI_COMM_WORLD);
  std::vector<int> all(static_cast<size_t>(w.size));
  for (int r = 0; r < w.size; ++r) all[static_cast<size_t>(r)] = r;
  EXPECT_EQ(world_ranks(node), all);  // mpirun on one host
  MPI_Comm_free(&node);
  const auto place = thetad::comm::node_place();
  EXPECT_EQ(place.node, 0);
  EXPECT_EQ(place.nodes, 1);
  EXPECT_FALSE(place.simulated);
}

TEST(NodeSplit, SimulatedNodesAreContiguousBlocks) {
  const World w;
  for (int n = 1; n <= w.size; ++n) {
    if (w.size % n != 0) continue;
    SimulateNodes env(std::to_string(n).c_str());
    const int per = w.size / n, first = w.rank / per * per;
    std::vector<int> want;
    for (int r = first; r < first + per; ++r) want.push_back(r);
    MPI_Comm node = split_node(MPI_COMM_WORLD);
    EXPECT_EQ(world_ranks(node), want) << n << " nodes";
    MPI_Comm_free(&node);
    const auto place = thetad::comm::node_place();
    EXPECT_EQ(place.node, w.rank / per) << n << " nodes";
    EXPECT_EQ(place.nodes, n);
    EXPECT_TRUE(place.simulated);
  }
}

// NCCL's host id: none without simulation; one per simulated node (the same for its ranks,
// another for every other node), built on the user's NCCL_HOSTID where one is set.
TEST(NodeSplit, EachSimulatedNodeIsItsOwnNcclHost) {
  const World w;
  {
    SimulateNodes env(nullptr);
    EXPECT_EQ(thetad::comm::simulated_nccl_host_id(), "");
  }
  if (w.size % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  SimulateNodes env("2");
  std::string id = thetad::comm::simulated_nccl_host_id();
  const std::string suffix = "/simulated-node-" + std::to_string(w.rank / (w.size / 2));
  ASSERT_GT(id.size(), suffix.size());
  EXPECT_EQ(id.substr(id.size() - suffix.size()), suffix) << id;
  setenv("NCCL_HOSTID", "rack7-host3", 1);
  EXPECT_EQ(thetad::comm::simulated_nccl_host_id(), "rack7-host3" + suffix);
  unsetenv("NCCL_HOSTID");
}

// Ranks of the host naming the same device are counted together, simulated nodes or not.
TEST(NodeSplit, RanksSharingADeviceAreCounted) {
  const World w;
  for (const char* sim : {static_cast<const char*>(nullptr), "2"}) {
    if (sim && w.size % 2 != 0) continue;
    SimulateNodes env(sim);
    // Ranks 0 and 2 name "0000:1b:00.0", the others a device of their own.
    const std::string key = w.rank % 2 == 0 && w.rank <= 2 ? "0000:1b:00.0" : "0000:" + std::to_string(w.rank) + ":00.0";
    const int want = w.rank % 2 == 0 && w.rank <= 2 ? (w.size > 2 ? 2 : 1) : 1;
    EXPECT_EQ(thetad::comm::ranks_sharing_device(key), want) << "rank " << w.rank << (sim ? ", 2 simulated nodes" : "");
    EXPECT_EQ(thetad::comm::ranks_sharing_device("same GPU"), w.size);  // one host: all of them
  }
}

TEST(NodeSplit, AnyCommunicatorSplitsByWorldBlocks) {
  const World w;
  if (w.size % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  SimulateNodes env("2");
  MPI_Comm reversed = MPI_COMM_NULL;  // ranks in the opposite order
  MPI_Comm_split(MPI_COMM_WORLD, 0, w.size - w.rank, &reversed);
  MPI_Comm node = split_node(reversed);
  std::vector<int> got = world_ranks(node), want;
  const int per = w.size / 2, first = w.rank / per * per;
  for (int r = first + per - 1; r >= first; --r) want.push_back(r);  // the node keeps comm's order
  EXPECT_EQ(got, want);
  MPI_Comm_free(&node);
  MPI_Comm_free(&reversed);
}

TEST(NodeSplit, BadCountsAreConfigErrorsNamingTheValue) {
  const World w;
  const std::string too_many = std::to_string(w.size + 1);
  std::vector<std::string> bad = {"0", "-1", "2x", " 2", too_many};
  if (w.size >= 3) bad.push_back(std::to_string(w.size - 1));  // does not divide the ranks
  for (const auto& v : bad) {
    SimulateNodes env(v.c_str());
    try {
      MPI_Comm node = split_node(MPI_COMM_WORLD);
      MPI_Comm_free(&node);
      ADD_FAILURE() << "THETAD_SIMULATE_NODES='" << v << "' accepted";
    } catch (const thetad::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("THETAD_SIMULATE_NODES='" + v + "'"), std::string::npos) << e.what();
    }
  }
  SimulateNodes empty("");
  EXPECT_EQ(thetad::comm::simulated_nodes(w.size), 0);  // empty is unset
}

}  // namespace
