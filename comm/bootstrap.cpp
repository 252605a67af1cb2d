// MPI bootstrap and control-plane helpers (see bootstrap.hpp).
#include "comm/bootstrap.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "comm/bucket_plan.hpp"
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

namespace {

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream is(s);
  std::string line;
  while (std::getline(is, line)) out.push_back(line);
  return out;
}

// The first difference between this rank's lines and rank 0's, in words.
std::string first_difference(int rank, const std::string& mine, const std::string& ref) {
  std::vector<std::string> a = split_lines(mine), b = split_lines(ref);
  size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (i < a.size() && i < b.size()) {
      if (a[i] != b[i])
        return detail::concat("rank ", rank, " has '", a[i], "' where rank 0 has '", b[i], "'");
    } else if (i < a.size()) {
      return detail::concat("rank ", rank, " has '", a[i], "' (line ", i + 1, ") that rank 0 lacks");
    } else {
      return detail::concat("rank ", rank, " lacks '", b[i], "' (line ", i + 1, ") that rank 0 has");
    }
  }
  return detail::concat("rank ", rank, " differs from rank 0 in line endings or spacing");
}

void bcast_string(std::string& s, int root) {
  uint64_t len = s.size();
  MPI_CHECK(MPI_Bcast(&len, 1, MPI_UINT64_T, root, MPI_COMM_WORLD));
  s.resize(len);
  if (len) MPI_CHECK(MPI_Bcast(s.data(), static_cast<int>(len), MPI_CHAR, root, MPI_COMM_WORLD));
}

}  // namespace

void check_consistent(const std::string& what, const std::string& canonical_lines) {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  // Hashes first: the common case costs 8 bytes per rank.
  uint64_t mine = fnv1a64(canonical_lines);
  std::vector<uint64_t> all(size);
  MPI_CHECK(MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD));
  std::vector<int> differing;
  for (int r = 1; r < size; ++r)
    if (all[r] != all[0]) differing.push_back(r);
  if (differing.empty()) return;

  // Rank 0's text goes to everyone; the first differing rank words the difference and sends
  // it back so that every rank throws (and logs) the same message.
  std::string ref = canonical_lines;
  bcast_string(ref, 0);
  const int culprit = differing.front();
  std::string msg;
  if (rank == culprit) msg = first_difference(rank, canonical_lines, ref);
  bcast_string(msg, culprit);
  std::ostringstream os;
  os << what << " differs across ranks: " << msg;
  if (differing.size() > 1) {
    os << " (ranks differing from rank 0:";
    for (int r : differing) os << " " << r;
    os << ")";
  }
  THETAD_LOG(error, "comm") << os.str();
  throw ConfigError(os.str());
}

void abort_job(int exit_code) {
  log::flush();
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort should not return; make sure this process ends regardless
}

}  // namespace thetad::comm
