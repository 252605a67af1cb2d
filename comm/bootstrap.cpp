// MPI bootstrap and control-plane helpers (see bootstrap.hpp).
#include "comm/bootstrap.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "comm/mpi/mpi_communicator.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"

#if THETAD_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include "comm/nccl/nccl_communicator.hpp"
#endif

namespace thetad::comm {

void throw_mpi_error(int code, const char* file, int line, const char* call) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof text, "code %d", code);
  throw CommError(detail::concat("MPI error in ", file, ":", line, ": ", text, " (", call, ")"));
}

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    MPI_Query_thread(&provided);
  } else {
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      throw CommError("MPI_Init_thread failed");
    owned_ = true;
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    if (owned_) MPI_Finalize();
    throw CommError(detail::concat(
        "the MPI library provides thread level ", provided, ", thetad needs MPI_THREAD_MULTIPLE (",
        MPI_THREAD_MULTIPLE, "): its progress thread calls MPI while the trainer does; use an MPI "
        "built with thread support"));
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

MpiSession::~MpiSession() {
  if (!owned_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

WorldInfo world_info() {
  WorldInfo w;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &w.rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &w.size));
  MPI_Comm local = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &local));
  MPI_Comm_rank(local, &w.local_rank);
  MPI_Comm_size(local, &w.local_size);
  MPI_Comm_free(&local);
  return w;
}

std::shared_ptr<Communicator> make_mpi_communicator() {
  return std::make_shared<MpiCommunicator>(MPI_COMM_WORLD);
}

#if THETAD_WITH_CUDA
std::shared_ptr<Communicator> make_nccl_communicator(int device) {
  WorldInfo w = world_info();
  ncclUniqueId id{};
  if (w.rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      throw CommError(detail::concat("NCCL error: ncclGetUniqueId: ", ncclGetErrorString(r)));
  }
  MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
  return std::make_shared<NcclCommunicator>(w.rank, w.size, &id, device);
}
#endif

void abort_job(int exit_code) {
  log::flush();
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort should not return; make sure this process ends regardless
}

}  // namespace thetad::comm
