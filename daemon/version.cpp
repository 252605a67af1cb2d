// Versions compiled in, for `thetad version`. Includes only LibTorch's version header.
#include "daemon/version.hpp"

#include <mpi.h>
#include <torch/version.h>
#include <yaml-cpp/yaml.h>

#include <sstream>

#include "comm/mpi_check.hpp"

#ifdef THETAD_WITH_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace thetad {

std::string version_text() {
  std::ostringstream os;
  os << "thetad " << THETAD_VERSION << " (commit " << THETAD_GIT_COMMIT << ")\n";
  os << "libtorch " << TORCH_VERSION << (THETAD_TORCH_CUDA ? " (CUDA)" : " (CPU)") << "\n";
  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_CHECK(MPI_Get_library_version(lib, &len));
  std::string mpi(lib, static_cast<size_t>(len));
  if (auto nl = mpi.find_first_of("\n,"); nl != std::string::npos) mpi.resize(nl);
  os << "mpi " << MPI_VERSION << "." << MPI_SUBVERSION << " (" << mpi << ")\n";
#ifdef THETAD_WITH_CUDA
  os << "cuda " << CUDART_VERSION / 1000 << "." << (CUDART_VERSION % 1000) / 10 << "\n";
  os << "nccl " << NCCL_MAJOR << "." << NCCL_MINOR << "." << NCCL_PATCH << "\n";
  constexpr bool kNcclLinked = true;
#else
  os << "cuda none\nnccl none\n";
  constexpr bool kNcclLinked = false;
#endif
  // What a job can actually use: NCCL needs both the library and a LibTorch with CUDA (the
  // tensors it reduces live on GPUs); the job loader refuses comm.backend: nccl otherwise.
  os << "backends: mpi (CPU tensors), nccl ";
  if (kNcclLinked && THETAD_TORCH_CUDA) os << "(GPU tensors)\n";
  else if (kNcclLinked) os << "unusable: this LibTorch is CPU-only, so comm.backend: nccl is refused\n";
  else os << "unusable: built without CUDA and NCCL, so comm.backend: nccl is refused\n";
  return os.str();
}

bool torch_has_cuda() { return THETAD_TORCH_CUDA != 0; }

}  // namespace thetad
