// A stalled peer: rank 1 does not join a collective, rank 0's wait fails with TimeoutError
// naming it within the timeout, and the job still ends cleanly (no MPI_Abort): rank 1 joins late
// so the orphaned request drains before the communicators are freed. Run with 2 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <string>
#include <vector>

#include "comm/bootstrap.hpp"
#include "common/errors.hpp"

using namespace thetad::comm;
using namespace std::chrono_literals;

namespace {
// `w`'s wait fails with TimeoutError `message` (exit 3) after `timeout`, not much later.
void expect_timeout(const WorkPtr& w, std::chrono::milliseconds timeout, const std::string& message) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    w->wait(timeout);
    ADD_FAILURE() << "no timeout";
  } catch (const thetad::TimeoutError& e) {
    EXPECT_EQ(std::string(e.what()), message);
    EXPECT_EQ(e.exit_code(), thetad::kExitComm);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(s, 0.95 * std::chrono::duration<double>(timeout).count());
  EXPECT_LT(s, std::chrono::duration<double>(timeout).count() + 3.0);
}
}  // namespace

TEST(MpiTimeout, StalledPeerTimesOutNamingTheCollective) {
  auto comm = make_mpi_communicator();
  std::vector<float> v(8, 1.0f);
  AllreduceOptions o;
  o.tag = {"allreduce", 17, 3};
  if (comm->rank() == 0) {
    auto w = comm->allreduce(v.data(), v.size(), DType::f32, o);
    // The communicator's first collective: #1.
    expect_timeout(w, 2s, "collective #1 (allreduce of bucket 3 at step 17) did not finish within 2 s");
    // The communicator is aborted: the work stays failed, later work fails at once.
    EXPECT_THROW(w->wait(1s), thetad::TimeoutError);
    EXPECT_THROW(comm->barrier({})->wait(1s), thetad::CommError);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm->rank() != 0) comm->allreduce(v.data(), v.size(), DType::f32, o)->wait(30s);
  MPI_Barrier(MPI_COMM_WORLD);
}

// A receive whose sender is late: bounded and named like a collective; the sender's late send
// drains the orphaned receive before the communicators are freed.
TEST(MpiTimeout, StalledSenderTimesOutNamingTheTransfer) {
  auto comm = make_mpi_communicator();
  std::vector<float> v(8, 1.0f);
  if (comm->rank() == 0) {
    auto w = comm->recv(v.data(), v.size(), DType::f32, 1, {"state of group 2 from rank 1 to rank 0", 9, -1});
    expect_timeout(w, 1s, "collective #1 (state of group 2 from rank 1 to rank 0 at step 9) did not finish within 1 s");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm->rank() == 1) comm->send(v.data(), v.size(), DType::f32, 0, {"late", 9, -1})->wait(30s);
  MPI_Barrier(MPI_COMM_WORLD);
}
