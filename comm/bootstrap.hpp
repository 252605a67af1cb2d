// Process bootstrap over MPI: MPI init/finalize, who we are (rank, local rank for the GPU),
// communicator factories and the job-wide abort (agreements among ranks: control_plane.hpp).
// MPI_CHECK turns MPI return codes into CommError.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.hpp"

namespace thetad::comm {

// RAII for MPI itself. Requires MPI_THREAD_MULTIPLE (the progress thread and the caller both
// call MPI) and makes MPI errors on world return codes instead of aborting the process. If MPI
// was already initialized by someone else, it checks the thread level and leaves finalize to them.
class MpiSession {
 public:
  MpiSession(int* argc = nullptr, char*** argv = nullptr);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

 private:
  bool owned_ = false;
};

struct WorldInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // rank among the processes of this host; picks the GPU
  int local_size = 1;
};
WorldInfo world_info();

// A host-memory communicator over a duplicate of MPI_COMM_WORLD. Collective over world.
std::shared_ptr<Communicator> make_mpi_communicator();

#if THETAD_WITH_CUDA
// An NCCL communicator on `device` over all ranks of world; rank 0's unique id travels by
// MPI_Bcast. Collective over world.
std::shared_ptr<Communicator> make_nccl_communicator(int device);
#endif

// Ends every process of the job with `exit_code` (MPI_Abort on world). For fatal communication
// failures, where MPI_Finalize could hang on a dead or stalled peer.
[[noreturn]] void abort_job(int exit_code);

// Builds "MPI error in file:line: <MPI_Error_string> (call)" and throws CommError.
[[noreturn]] void throw_mpi_error(int code, const char* file, int line, const char* call);

}  // namespace thetad::comm

// 0 is MPI_SUCCESS by the standard; comparing with it keeps mpi.h out of this header.
#define MPI_CHECK(call)                                                     \
  do {                                                                      \
    const int thetad_mpi_rc_ = (call);                                      \
    if (thetad_mpi_rc_ != 0)                                                \
      ::thetad::comm::throw_mpi_error(thetad_mpi_rc_, __FILE__, __LINE__, #call); \
  } while (0)
