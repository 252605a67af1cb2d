// The control plane's agreements that carry values (run with 3 ranks): the element-wise min and
// max of int64 and double vectors, the non-blocking gather, and the NCCL bootstrap's id exchange, whose bytes travel with
// no NCCL (a stalled rank: tests/offload/stalled_agreement.sh).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "comm/bootstrap.hpp"
#include "comm/control_plane.hpp"
#include "common/errors.hpp"

using namespace thetad::comm;
using namespace std::chrono_literals;

namespace {

ControlPlane plane() { return ControlPlane(make_mpi_communicator(), 30s); }

TEST(ControlPlaneValues, MinAndMaxOfInt64) {
  ControlPlane p = plane();
  const int64_t r = p.rank(), n = p.size();
  // Rank r holds r, -r and a value only the last rank makes the largest (beyond 2^53: no double).
  const int64_t big = (int64_t{1} << 60) + (r == n - 1 ? 7 : 0);
  const std::vector<int64_t> mine{r, -r, big};
  EXPECT_EQ(p.min(mine, {"test min"}), (std::vector<int64_t>{0, -(n - 1), int64_t{1} << 60}));
  EXPECT_EQ(p.max(mine, {"test max"}), (std::vector<int64_t>{n - 1, 0, (int64_t{1} << 60) + 7}));
  EXPECT_TRUE(p.min(std::vector<int64_t>{}, {"test empty"}).empty());
}

TEST(ControlPlaneValues, MinAndMaxOfDoublesExact) {
  ControlPlane p = plane();
  const double r = p.rank();
  // Bit-exact: the smallest subnormal, and a value that differs from another only in its last bit.
  const double tiny = std::numeric_limits<double>::denorm_min() * (1 + r);
  const double near1 = std::nextafter(1.0, 2.0 + r);
  const std::vector<double> mine{1.5 * r, tiny, near1, -r};
  const std::vector<double> lo = p.min(mine, {"test min"}), hi = p.max(mine, {"test max"});
  EXPECT_EQ(lo, (std::vector<double>{0.0, std::numeric_limits<double>::denorm_min(), std::nextafter(1.0, 2.0),
                                     -(p.size() - 1.0)}));
  EXPECT_EQ(hi[0], 1.5 * (p.size() - 1));
  EXPECT_EQ(hi[1], std::numeric_limits<double>::denorm_min() * p.size());
  EXPECT_EQ(hi[2], std::nextafter(1.0, 2.0));
  EXPECT_EQ(hi[3], 0.0);
}

// post_gather: every rank's words, rank by rank, whatever was posted in between.
TEST(ControlPlaneValues, GatherWithoutBlocking) {
  ControlPlane p = plane();
  const int64_t r = p.rank(), n = p.size();
  ControlPlane::Gathered g = p.post_gather({r, -r, int64_t{1} << (40 + r)}, {"test gather"});
  EXPECT_TRUE(g.posted());
  EXPECT_EQ(p.max(std::vector<int64_t>{r}, {"test max between"})[0], n - 1);
  const std::vector<int64_t>& all = g.get();
  ASSERT_EQ(all.size(), static_cast<size_t>(3 * n));
  for (int64_t q = 0; q < n; ++q) {
    EXPECT_EQ(all[3 * q], q);
    EXPECT_EQ(all[3 * q + 1], -q);
    EXPECT_EQ(all[3 * q + 2], int64_t{1} << (40 + q));
  }
  EXPECT_TRUE(g.ready());
}

TEST(BootstrapId, RootsBytesReachEveryRank) {
  ControlPlane p = plane();
  const std::string id("id\0with\0zeros-128", 17);  // an ncclUniqueId is opaque bytes
  int made = 0;
  const std::string got = exchange_bootstrap_id(p, [&] {
    ++made;
    return id;
  });
  EXPECT_EQ(got, id);
  EXPECT_EQ(made, p.rank() == 0 ? 1 : 0);  // made on the root only
}

TEST(BootstrapId, RootsFailureReachesEveryRank) {
  ControlPlane p = plane();
  try {
    exchange_bootstrap_id(p, []() -> std::string { throw thetad::CommError("NCCL error: ncclGetUniqueId: no"); });
    ADD_FAILURE() << "no error";
  } catch (const thetad::CommError& e) {
    if (p.rank() == 0) {
      EXPECT_STREQ(e.what(), "NCCL error: ncclGetUniqueId: no");
    } else {
      EXPECT_EQ(std::string(e.what()),
                "NCCL bootstrap: the unique id exchange failed on rank 0: NCCL error: ncclGetUniqueId: no");
    }
  }
}

}  // namespace
