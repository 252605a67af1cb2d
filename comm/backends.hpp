// The backends' factories: each is defined in its backend's folder (comm/mpi/, comm/nccl/), so
// the rest of comm/ depends on the Communicator interface only.
#pragma once

#include <memory>

#include "comm/communicator.hpp"

namespace thetad::comm {

// A host-memory communicator over a duplicate of MPI_COMM_WORLD. Collective over world.
// (comm/mpi/mpi_communicator.cpp; a communicator over another MPI_Comm: MpiCommunicator.)
std::shared_ptr<Communicator> make_mpi_communicator();

#if THETAD_WITH_CUDA
// An NCCL communicator on `device` over all ranks of world; rank 0's unique id travels by
// MPI_Bcast. Collective over world. (comm/nccl/nccl_communicator.cpp)
std::shared_ptr<Communicator> make_nccl_communicator(int device);
#endif

}  // namespace thetad::comm
