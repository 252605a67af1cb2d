// Input paths with their placeholders expanded (see input_path.hpp).
#include "daemon/plan/input_path.hpp"

#include <mpi.h>

#include "config/loader.hpp"

namespace thetad::daemon {

std::string input_path(const std::string& path, const config::Job& job) {
  int initialized = 0, finalized = 0, rank = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);  // local: no collective
  return config::expand_path(path, job, rank);
}

}  // namespace thetad::daemon
