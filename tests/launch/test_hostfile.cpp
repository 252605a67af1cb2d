// Hostfile counts as the plan reads them: every slots= checked (no atoi wrap-around to a
// negative or huge -np), exit 2 naming the file and the line; a host listed twice refused with
// both lines (mpirun would refuse it, or run a node other than the one planned).
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "common/errors.hpp"
#include "launch/hostfile.hpp"

namespace thetad::launch {
namespace {

// The message of the ConfigError that parsing `text` throws ("" when none).
std::string refusal(const std::string& text) {
  try {
    parse_hostfile(text, "hosts.txt");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Hostfile, SlotsOutOfRangeNameTheFileAndLine) {
  EXPECT_EQ(refusal("a slots=4\nb slots=2147483648\n"),
            "hostfile 'hosts.txt' line 2: slots=2147483648 is not a whole number from 1 to 1048576");
  for (const char* bad : {"slots=0", "slots=99999999999", "slots=-1", "slots=", "slots=4x", "slots=1048577",
                          "max_slots=0", "count=0"}) {
    SCOPED_TRACE(bad);
    const std::string msg = refusal(std::string("# comment\n\nnode1 ") + bad + "\n");
    EXPECT_EQ(msg.rfind("hostfile 'hosts.txt' line 3: ", 0), 0u) << msg;
  }
}

TEST(Hostfile, HostsAndTheirSlots) {
  auto h = parse_hostfile("# c\nnode1 slots=4 max_slots=8   # trailing\n  node2 slots = 2\nnode3\n", "f");
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0].host, "node1");
  EXPECT_EQ(h[0].slots, 4);  // max_slots= is not slots=
  EXPECT_EQ(h[0].line, 2);
  EXPECT_EQ(h[1].slots, 2);
  EXPECT_EQ(h[2].slots, 0);
  EXPECT_EQ(parse_hostfile("n slots=1048576\n", "f")[0].slots, 1048576);
}

TEST(Hostfile, HostListedTwiceNamesBothLines) {
  // Open MPI 4.1 refuses this one itself ("multiple definitions of the slot count"), after the
  // launcher had planned two nodes of 2: the launcher reported only "no rank recorded a failure".
  EXPECT_EQ(refusal("# c\nnodeA slots=2\nnodeB slots=2\nnodeA slots=2\n"),
            "hostfile 'hosts.txt' lines 2 and 4 both name host 'nodeA': list each host once, with "
            "slots=N for its ranks (mpirun takes both lines for one node)");
  // What mpirun takes for one node (user@, the domain, a trailing dot, a loopback address, this
  // machine's own name) and what DNS does (case): refused the same way.
  char here[256] = {};
  ASSERT_EQ(::gethostname(here, sizeof here - 1), 0);
  const std::string self(here);
  const std::vector<std::string> same = {
      "nodeA\nnodeA slots=1\n", "nodeA slots=2\nnodeA\n", "nodeA\nnodeA\n", "nodeA\nNODEA\n",
      "nodeA\nnodeA.\n", "nodeA\nnodeA.cluster.example\n", "nodeA.x.example\nnodeA.y.example\n",
      "nodeA\nroot@nodeA\n", "10.0.0.1\n10.0.0.1 slots=2\n", "localhost\n127.0.0.1\n", "::1\nlocalhost\n",
      "localhost\n" + self + "\n"};
  for (const std::string& twice : same) {
    SCOPED_TRACE(twice);
    const std::string msg = refusal(twice);
    EXPECT_EQ(msg.rfind("hostfile 'hosts.txt' lines 1 and 2 both name host '", 0), 0u) << msg;
  }
  EXPECT_EQ(refusal("nodeA slots=2\nNODEA slots=2\n"),
            "hostfile 'hosts.txt' lines 1 and 2 both name host 'nodeA' (line 2: 'NODEA'): list each host once, "
            "with slots=N for its ranks (host names ignore case: both lines are one machine)");
  // Different hosts stay apart: the dots of an IPv4 address are not a domain.
  EXPECT_EQ(parse_hostfile("10.0.0.1\n10.0.0.2\nnodeA\nnodeB\nnodeA1\n", "f").size(), 5u);
}

TEST(Hostfile, CountsParsedWithoutOverflow) {
  EXPECT_EQ(parse_count("1"), 1);
  EXPECT_EQ(parse_count("1048576"), 1048576);
  EXPECT_EQ(parse_count("2147483648"), -1);
  EXPECT_EQ(parse_count("99999999999999999999999"), -1);
  EXPECT_EQ(parse_count("0"), -1);
  EXPECT_EQ(parse_count("01"), -1);
  EXPECT_EQ(parse_count("+1"), -1);
}

}  // namespace
}  // namespace thetad::launch
