// Rank logs as whole lines: a byte stream (a rank's stderr, a wrapper's connection, mpirun's
// stderr) cut into complete lines of bounded length, the rank tag of the merged stream, and the
// escaping of control bytes before anything reaches a terminal or a merged log. Pure: no I/O.
#pragma once

#include <cstddef>
#include <string>

namespace thetad::launch {

// The longest line kept whole, in bytes without its '\n' (docs/deploy.md): a longer one is cut
// into pieces of this size, each but the last ending with kPartialMark, so that output without
// a newline never grows a buffer without bound.
inline constexpr size_t kMaxLineBytes = 64 * 1024;
inline constexpr const char* kPartialMark = " [partial line: continues on the next line]";
// What the launcher accepts from a wrapper's connection or mpirun's stderr as one line: a
// piece above with its rank tag and mark.
inline constexpr size_t kMaxMergedLineBytes = kMaxLineBytes + 256;

// Collects bytes and hands out only complete lines ('\n'-terminated), several at once; a line
// longer than `max_line` comes out in marked pieces as soon as each is full.
class LineBuffer {
 public:
  explicit LineBuffer(size_t max_line = kMaxLineBytes) : max_(max_line) {}
  // Appends `n` bytes; returns the complete lines (and full pieces) now available.
  std::string feed(const char* data, size_t n);
  // At end of stream: the last, unterminated line with a '\n' added ("" when none).
  std::string finish();
  size_t pending() const { return partial_.size(); }

 private:
  size_t max_;
  std::string partial_;
};

// The merged stream's form of `lines` (complete lines) from rank `rank`: "[rank R] " in front of
// every line that does not start with rank R's own tag (thetad's "[time] [rank R] ..." or
// "[rank R] ..."), whatever else it contains: a line quoting another rank's tag is still R's.
std::string tag_lines(const std::string& lines, int rank);

// `lines` with control bytes (escape sequences, carriage returns, C1 controls, invalid UTF-8)
// written as \xNN; newlines and tabs kept. What reaches a terminal or a merged log.
std::string escape_controls(const std::string& lines);

}  // namespace thetad::launch
