// mpirun's network flags: one host keeps the ranks on shared memory (no TCP BTL: it listens on
// every interface, unauthenticated); several hosts keep what they need.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "launch/plan.hpp"

namespace thetad::launch {
namespace {

// The value of `--mca KEY VALUE` in `flags`, "" when absent.
std::string mca(const std::vector<std::string>& flags, const std::string& key) {
  for (size_t i = 0; i + 2 < flags.size(); ++i)
    if (flags[i] == "--mca" && flags[i + 1] == key) return flags[i + 2];
  return "";
}

bool mentions_tcp_btl(const std::vector<std::string>& flags) {
  return mca(flags, "btl").find("tcp") != std::string::npos ||
         std::any_of(flags.begin(), flags.end(), [](const std::string& w) { return w.rfind("btl_tcp", 0) == 0; });
}

TEST(PlanNetwork, OneHostUsesSharedMemoryOnly) {
  for (bool loopback_only : {false, true}) {
    const auto f = mpirun_network_flags(true, loopback_only);
    EXPECT_EQ(mca(f, "btl"), "self,vader");
    EXPECT_FALSE(mentions_tcp_btl(f));
    EXPECT_EQ(mca(f, "oob_tcp_if_include"), "lo");  // mpirun's own channel: loopback only
  }
}

TEST(PlanNetwork, SeveralHostsKeepWhatTheyNeed) {
  // With a network: MPI's own choice of fabric, TCP included.
  EXPECT_TRUE(mpirun_network_flags(false, false).empty());
  // Hosts on a machine with loopback only: TCP over lo between them.
  const auto f = mpirun_network_flags(false, true);
  EXPECT_EQ(mca(f, "btl"), "self,vader,tcp");
  EXPECT_EQ(mca(f, "btl_tcp_if_include"), "lo");
}

}  // namespace
}  // namespace thetad::launch
