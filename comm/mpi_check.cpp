// throw_mpi_error (see mpi_check.hpp).
#include "comm/mpi_check.hpp"

#include <mpi.h>

#include <cstdio>
#include <string>

#include "common/errors.hpp"
#include "common/log.hpp"

namespace thetad::comm {

namespace {
std::string mpi_error_text(int code, const char* file, int line, const char* call) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof text, "code %d", code);
  return detail::concat("MPI error in ", file, ":", line, ": ", text, " (", call, ")");
}
}  // namespace

void throw_mpi_error(int code, const char* file, int line, const char* call) {
  throw CommError(mpi_error_text(code, file, line, call));
}

void log_mpi_error(int code, const char* file, int line, const char* call) noexcept {
  try {
    THETAD_LOG(warn, "comm") << mpi_error_text(code, file, line, call);
  } catch (...) {  // logging itself failed: nothing left to tell
  }
}

}  // namespace thetad::comm
