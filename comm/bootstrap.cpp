// MPI bootstrap: session, world info, job abort (see bootstrap.hpp).
#include "comm/bootstrap.hpp"

#include <mpi.h>

#include <cstdlib>

#include "comm/control_plane.hpp"
#include "comm/node_memory.hpp"
#include "comm/mpi/node_comm.hpp"
#include "comm/node_split.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/test_hooks.hpp"

namespace thetad::comm {

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    MPI_CHECK(MPI_Query_thread(&provided));
  } else {
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      throw CommError("MPI_Init_thread failed");
    owned_ = true;
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    if (owned_) MPI_CHECK_NOTHROW(MPI_Finalize());  // the error below matters more
    throw CommError(detail::concat(
        "the MPI library provides thread level ", provided, ", thetad needs MPI_THREAD_MULTIPLE (",
        MPI_THREAD_MULTIPLE, "): its progress thread calls MPI while the trainer does; use an MPI "
        "built with thread support"));
  }
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
}

MpiSession::~MpiSession() {
  if (!owned_) return;
  int finalized = 0;
  MPI_CHECK_NOTHROW(MPI_Finalized(&finalized));
  if (!finalized) MPI_CHECK_NOTHROW(MPI_Finalize());
}

WorldInfo world_info() {
  WorldInfo w;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &w.rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &w.size));
  MPI_Comm local = split_node(MPI_COMM_WORLD);  // real hosts, or THETAD_SIMULATE_NODES blocks
  MPI_CHECK(MPI_Comm_rank(local, &w.local_rank));
  MPI_CHECK(MPI_Comm_size(local, &w.local_size));
  MPI_CHECK(MPI_Comm_free(&local));
  return w;
}

std::string exchange_bootstrap_id(ControlPlane& plane, const std::function<std::string()>& make_id, int root) {
  test_hooks::stall_at(test_hooks::StallPoint::nccl_id_exchange, plane.rank());
  const CollectiveTag what{"NCCL bootstrap: the unique id exchange"};
  std::string id;
  std::exception_ptr error;
  if (plane.rank() == root) {
    try {
      id = make_id();
    } catch (...) {
      error = std::current_exception();
    }
  }
  plane.agree(error, what);  // a root that cannot make one fails every rank, not only itself
  return plane.broadcast(std::move(id), root, what);
}

void prepare_job_abort() noexcept {
  int size = 1;  // (not world_info(): that one is collective)
  MPI_CHECK_NOTHROW(MPI_Comm_size(MPI_COMM_WORLD, &size));
  if (size > 1) abandon_node_memory();
}

void abort_job(int exit_code) {
  log::flush();
  (void)MPI_Abort(MPI_COMM_WORLD, exit_code);  // no return code to act on: we end regardless
  std::_Exit(exit_code);  // MPI_Abort should not return; make sure this process ends regardless
}

}  // namespace thetad::comm
