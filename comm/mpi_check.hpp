// MPI_CHECK: the one check macro for MPI return codes. A failed call throws CommError
// "MPI error in file:line: <MPI_Error_string> (call)". MPI_CHECK_NOTHROW is for destructors and
// cleanup after an error: it logs the same text as a warning instead. Torch-free; needs no mpi.h.
#pragma once

namespace thetad::comm {

// Builds "MPI error in file:line: <MPI_Error_string> (call)" and throws CommError.
[[noreturn]] void throw_mpi_error(int code, const char* file, int line, const char* call);
// Logs that text as a warning; never throws.
void log_mpi_error(int code, const char* file, int line, const char* call) noexcept;

}  // namespace thetad::comm

// 0 is MPI_SUCCESS by the standard; comparing with it keeps mpi.h out of this header.
#define THETAD_MPI_CHECK_WITH_(call, on_error)                                      \
  do {                                                                              \
    const int thetad_mpi_rc_ = (call);                                              \
    if (thetad_mpi_rc_ != 0) on_error(thetad_mpi_rc_, __FILE__, __LINE__, #call);   \
  } while (0)

#define MPI_CHECK(call) THETAD_MPI_CHECK_WITH_(call, ::thetad::comm::throw_mpi_error)
#define MPI_CHECK_NOTHROW(call) THETAD_MPI_CHECK_WITH_(call, ::thetad::comm::log_mpi_error)
