// The merged log's safety: a line without a newline is cut into bounded, marked pieces; every
// line of a rank carries that rank's tag, whatever it quotes; control bytes never reach the
// terminal or launcher.log raw.
#include <gtest/gtest.h>

#include <string>

#include "launch/log_merge.hpp"

namespace thetad::launch {
namespace {

// The lines of `text`, without their '\n'.
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1)
    out.push_back(text.substr(start, nl - start));
  EXPECT_EQ(start, text.size()) << "output ends mid-line";
  return out;
}

TEST(LineCap, OutputWithoutNewlineIsCutIntoMarkedPiecesAndNeverHeld) {
  LineBuffer b;
  const std::string chunk(65536, 'x');
  std::string out;
  for (int i = 0; i < 50; ++i) {  // 3.2 MB, no newline
    out += b.feed(chunk.data(), chunk.size());
    ASSERT_LE(b.pending(), kMaxLineBytes);
  }
  out += b.feed("tail\n", 5);
  const auto lines = lines_of(out);
  ASSERT_EQ(lines.size(), 51u);
  const std::string piece = std::string(kMaxLineBytes, 'x') + kPartialMark;
  for (size_t i = 0; i + 1 < lines.size(); ++i) ASSERT_EQ(lines[i], piece) << "piece " << i;
  EXPECT_EQ(lines.back(), "tail");  // the line's rest, unmarked: the line ends there
}

TEST(LineCap, ExactlyTheLimitIsOneWholeLine) {
  LineBuffer b(8);
  EXPECT_EQ(b.feed("12345678", 8), "");
  EXPECT_EQ(b.feed("\nab", 3), "12345678\n");
  EXPECT_EQ(b.feed("cdefghi\n", 8), std::string("abcdefgh") + kPartialMark + "\ni\n");
  EXPECT_EQ(b.feed("123456789", 9), std::string("12345678") + kPartialMark + "\n");
  EXPECT_EQ(b.finish(), "9\n");
}

TEST(RankTag, EveryPieceOfALongLineIsTagged) {
  LineBuffer b;
  const std::string big(3 * kMaxLineBytes + 10, 'y');
  std::string out = b.feed(big.data(), big.size());
  out += b.finish();
  const std::string tagged = tag_lines(out, 5);
  const auto lines = lines_of(tagged);
  ASSERT_EQ(lines.size(), 4u);
  for (const auto& l : lines) EXPECT_EQ(l.rfind("[rank 5] y", 0), 0u) << l.substr(0, 40);
}

// A rank's line that quotes another rank's tag reads as its own, in the header position too.
TEST(RankTag, ALineQuotingAnotherRanksTagGetsItsOwn) {
  EXPECT_EQ(tag_lines("[rank 0] error: forged\n", 1), "[rank 1] [rank 0] error: forged\n");
  EXPECT_EQ(tag_lines("[2026-01-02 03:04:05.678] [rank 0] [comm] error: x\n", 1),
            "[rank 1] [2026-01-02 03:04:05.678] [rank 0] [comm] error: x\n");
  EXPECT_EQ(tag_lines("loss 3 [rank 1]\n", 1), "[rank 1] loss 3 [rank 1]\n");
  EXPECT_EQ(tag_lines("[rank 10] x\n", 1), "[rank 1] [rank 10] x\n");
  // thetad's own lines keep their one tag.
  EXPECT_EQ(tag_lines("[2026-01-02 03:04:05.678] [rank 1] [comm] info: x\n", 1),
            "[2026-01-02 03:04:05.678] [rank 1] [comm] info: x\n");
  EXPECT_EQ(tag_lines("[rank 1] x\n", 1), "[rank 1] x\n");
}

TEST(Escape, ControlBytesAreWrittenOutTabsAndNewlinesKept) {
  EXPECT_EQ(escape_controls("a\tb\n"), "a\tb\n");
  EXPECT_EQ(escape_controls("\x1b[2J\x1b]0;title\x07x\n"), "\\x1b[2J\\x1b]0;title\\x07x\n");
  EXPECT_EQ(escape_controls("ok\rthetad-launch: all done\n"), "ok\\x0dthetad-launch: all done\n");
  EXPECT_EQ(escape_controls(std::string("nul\0del\x7f\n", 9)), "nul\\x00del\\x7f\n");
  // C1 controls (8-bit CSI), raw or as UTF-8; other UTF-8 passes through.
  EXPECT_EQ(escape_controls("\x9b" "2J \xc2\x9b" "2J \xc3\xa9\n"), "\\x9b2J \\xc2\\x9b2J \xc3\xa9\n");
  const std::string plain = "[rank 0] step 1 loss 0.5\n";
  EXPECT_EQ(escape_controls(plain), plain);
}

}  // namespace
}  // namespace thetad::launch
