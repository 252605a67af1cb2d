// Process bootstrap over MPI: MPI init/finalize, who we are (rank, local rank for the GPU), the
// NCCL bootstrap's id exchange and the job-wide abort (agreements among ranks:
// control_plane.hpp). Includes the communicator factories (backends.hpp) and MPI_CHECK
// (mpi_check.hpp) for its callers.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/backends.hpp"
#include "comm/communicator.hpp"
#include "comm/mpi_check.hpp"

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

class ControlPlane;

// The NCCL bootstrap's id exchange (no NCCL in it: the id is opaque bytes): `make_id` runs on
// `root`, and its bytes reach every rank of the plane, each step bounded by the plane's timeout
// (a rank that never arrives: TimeoutError naming "NCCL bootstrap: the unique id exchange"). A
// failure of make_id reaches every rank as ControlPlane::agree says. Collective over the plane.
std::string exchange_bootstrap_id(ControlPlane& plane, const std::function<std::string()>& make_id, int root = 0);

// Ends every process of the job with `exit_code` (MPI_Abort on world). For fatal communication
// failures, where MPI_Finalize could hang on a dead or stalled peer.
[[noreturn]] void abort_job(int exit_code);

// A process whose job of more than one rank is about to end by abort_job, before it unwinds what
// it built: nothing destroyed from now on waits in a collective for ranks that may never join it
// (the node's shared memory: abandon_node_memory, node_memory.hpp), since they may not have heard
// of the failure yet. Nothing changes in a world of one. Local; never throws.
void prepare_job_abort() noexcept;

}  // namespace thetad::comm
