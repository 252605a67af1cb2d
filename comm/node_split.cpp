// The split of the job's ranks into nodes, real or simulated (see node_split.hpp).
#include "comm/node_split.hpp"

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "comm/mpi/node_comm.hpp"
#include "comm/mpi_check.hpp"
#include "common/errors.hpp"

namespace thetad::comm {

int simulated_nodes(int world_size) {
  const char* raw = std::getenv(kSimulateNodesEnv);
  if (raw == nullptr || *raw == '\0') return 0;
  const std::string text(raw);
  // Digits only: "2x", "-1" or " 2" are typos to report, not numbers to guess at.
  const bool digits = text.size() <= 9 && text.find_first_not_of("0123456789") == std::string::npos;
  const int n = digits ? std::stoi(text) : -1;
  if (n < 1 || n > world_size || world_size % n != 0)
    throw ConfigError(detail::concat(
        kSimulateNodesEnv, "='", text, "': simulated nodes must be a whole number from 1 to the ",
        world_size, " ranks of the job that divides it (each simulated node gets the same number "
        "of contiguous ranks)"));
  return n;
}

namespace {
// The simulated node of a world rank: blocks of contiguous ranks (node_split.hpp).
int simulated_node_of(int world_rank, int world_size, int nodes) { return world_rank / (world_size / nodes); }
}  // namespace

MPI_Comm split_node(MPI_Comm comm) {
  int world_rank = 0, world_size = 1;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  const int sim = simulated_nodes(world_size);
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_Comm block = MPI_COMM_NULL;
  // Color by world block first, then by shared memory within it: a simulated node never spans
  // two real hosts (the host arena is a shared-memory window).
  const int color = sim > 0 ? simulated_node_of(world_rank, world_size, sim) : 0;
  MPI_CHECK(MPI_Comm_split(comm, color, rank, &block));
  MPI_Comm node = MPI_COMM_NULL;
  const int rc = MPI_Comm_split_type(block, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_CHECK_NOTHROW(MPI_Comm_free(&block));
  MPI_CHECK(rc);
  return node;
}

NodePlace node_place() {
  int world_rank = 0, world_size = 1;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  MPI_Comm node = split_node(MPI_COMM_WORLD);
  int lowest = world_rank;  // the node's name among nodes: its lowest world rank
  const int rc = MPI_Allreduce(&world_rank, &lowest, 1, MPI_INT, MPI_MIN, node);
  MPI_CHECK_NOTHROW(MPI_Comm_free(&node));
  MPI_CHECK(rc);
  const int leader = lowest == world_rank ? 1 : 0;
  std::vector<int> leaders(static_cast<size_t>(world_size), 0);
  MPI_CHECK(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD));
  NodePlace p;
  p.simulated = simulated_nodes(world_size) > 0;
  p.nodes = 0;
  p.node = 0;
  for (int r = 0; r < world_size; ++r) {
    if (leaders[static_cast<size_t>(r)] == 0) continue;
    p.nodes += 1;
    if (r < lowest) p.node += 1;
  }
  return p;
}

int ranks_sharing_device(const std::string& device_key) {
  MPI_Comm host = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host));
  int size = 1;
  MPI_CHECK_NOTHROW(MPI_Comm_size(host, &size));
  // Keys of one fixed length (bus ids are "0000:1b:00.0"; longer keys are cut, shorter padded).
  constexpr size_t kKey = 32;
  std::string mine = device_key.substr(0, kKey);
  mine.resize(kKey, '\0');
  std::vector<char> all(kKey * static_cast<size_t>(size));
  const int rc = MPI_Allgather(mine.data(), static_cast<int>(kKey), MPI_CHAR, all.data(), static_cast<int>(kKey),
                               MPI_CHAR, host);
  MPI_CHECK_NOTHROW(MPI_Comm_free(&host));
  MPI_CHECK(rc);
  int same = 0;
  for (int r = 0; r < size; ++r) same += std::string(&all[kKey * static_cast<size_t>(r)], kKey) == mine ? 1 : 0;
  return same;
}

std::string simulated_nccl_host_id() {
  int world_rank = 0, world_size = 1;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  const int sim = simulated_nodes(world_size);
  if (sim == 0) return {};
  std::string host;
  if (const char* given = std::getenv("NCCL_HOSTID"); given != nullptr && *given != '\0') {
    host = given;
  } else {
    char name[256] = {};
    host = gethostname(name, sizeof name - 1) == 0 ? name : "localhost";
  }
  return detail::concat(host, "/simulated-node-", simulated_node_of(world_rank, world_size, sim));
}

}  // namespace thetad::comm
