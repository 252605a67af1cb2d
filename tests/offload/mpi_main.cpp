// GoogleTest main for the offload tests that run as real MPI processes: MPI is initialized with
// MPI_THREAD_MULTIPLE around the test run; only rank 0 prints gtest's report. Exits 77 (ctest:
// skipped) when every test skipped.
#include <gtest/gtest.h>
#include <mpi.h>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  // A failure on any rank fails the run on every rank.
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  // Every test skipped on every rank: 77, which ctest reports as skipped (SKIP_RETURN_CODE).
  const auto* unit = ::testing::UnitTest::GetInstance();
  int all_skipped = unit->test_to_run_count() > 0 && unit->skipped_test_count() == unit->test_to_run_count() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_skipped, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst == 0 && all_skipped ? 77 : worst;
}
