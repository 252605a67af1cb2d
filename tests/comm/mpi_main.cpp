// gtest main for the multi-rank comm tests: MPI through MpiSession, rank 0 prints the usual
// gtest output, other ranks print only their failures (tagged with the rank), and the process
// exits non-zero on every rank when any rank failed, 77 (skipped) when every test skipped.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "comm/bootstrap.hpp"
#include "common/log.hpp"

namespace {

constexpr int kSkipExitCode = 77;  // ctest's SKIP_RETURN_CODE (cmake/ThetadTesting.cmake)

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  thetad::comm::MpiSession mpi(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  thetad::log::init({rank, rank == 0 ? "warn" : "error", ""});
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed && rank == 0) std::fprintf(stderr, "a test failed on at least one rank\n");
  // Every test skipped on every rank (the NCCL tests without a GPU): ctest reports it skipped.
  const auto* unit = ::testing::UnitTest::GetInstance();
  int all_skipped = unit->test_to_run_count() > 0 && unit->skipped_test_count() == unit->test_to_run_count() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_skipped, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!failed && all_skipped) return kSkipExitCode;
  return failed;
}
