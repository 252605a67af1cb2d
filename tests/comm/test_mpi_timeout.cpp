// A stalled peer: rank 1 does not join a collective, rank 0's wait fails with TimeoutError
// naming it within the timeout, and the job still ends cleanly (no MPI_Abort): rank 1 joins late
// so the orphaned request drains before the communicators are freed. Run with 2 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <vector>

#include "comm/bootstrap.hpp"
#include "common/errors.hpp"

using namespace thetad::comm;
using namespace std::chrono_literals;

TEST(MpiTimeout, StalledPeerTimesOutNamingTheCollective) {
  auto comm = make_mpi_communicator();
  std::vector<float> v(8, 1.0f);
  AllreduceOptions o;
  o.tag = {"allreduce", 17, 3};
  if (comm->rank() == 0) {
    auto w = comm->allreduce(v.data(), v.size(), DType::f32, o);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      w->wait(2s);
      ADD_FAILURE() << "no timeout";
    } catch (const thetad::TimeoutError& e) {
      // The communicator's first collective: #1.
      EXPECT_EQ(std::string(e.what()),
                "collective #1 (allreduce of bucket 3 at step 17) did not finish within 2 s");
      EXPECT_EQ(e.exit_code(), thetad::kExitComm);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(s, 1.9);
    EXPECT_LT(s, 5.0);
    // The communicator is aborted: the work stays failed, later work fails at once.
    EXPECT_THROW(w->wait(1s), thetad::TimeoutError);
    EXPECT_THROW(comm->barrier({})->wait(1s), thetad::CommError);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm->rank() != 0) comm->allreduce(v.data(), v.size(), DType::f32, o)->wait(30s);
  MPI_Barrier(MPI_COMM_WORLD);
}
