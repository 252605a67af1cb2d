// The split of the job's ranks into nodes as an MPI communicator: for the MPI code of comm/ (the
// bootstrap, node_split.cpp, the node's shared memory) and its tests; the rest of the program
// learns of nodes through node_split.hpp and node_memory.hpp, without MPI.
#pragma once

#include <mpi.h>

namespace thetad::comm {

// A new communicator (the caller frees it) of the ranks of `comm` on the caller's node
// (node_split.hpp: a host, or a simulated node), ordered as in `comm`. Collective over `comm`.
// Simulated nodes are blocks of MPI_COMM_WORLD's ranks, whatever `comm` is, so every
// communicator splits alike.
MPI_Comm split_node(MPI_Comm comm);

}  // namespace thetad::comm
