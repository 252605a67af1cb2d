// Hostfile counts as the plan reads them: every slots= checked (no atoi wrap-around to a
// negative or huge -np), exit 2 naming the file and the line.
#include <gtest/gtest.h>

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
