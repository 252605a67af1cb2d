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
class ControlPlane;
// An NCCL communicator on `device` over all ranks of world (`plane` is world's control plane):
// rank 0's unique id reaches the others through exchange_bootstrap_id (bootstrap.hpp), bounded by
// the plane's timeout. Collective over world. (comm/nccl/nccl_communicator.cpp)
std::shared_ptr<Communicator> make_nccl_communicator(int device, ControlPlane& plane);
#endif

}  // namespace thetad::comm
