// Rank logs as whole lines: a byte stream (a rank's stderr, a wrapper's connection, mpirun's
// stderr) cut into complete lines, and the rank tag of the merged stream. Pure: no I/O.
#pragma once

#include <string>

namespace thetad::launch {

// Collects bytes and hands out only complete lines ('\n'-terminated), several at once.
class LineBuffer {
 public:
  // Appends `n` bytes; returns the complete lines now available (possibly empty).
  std::string feed(const char* data, size_t n);
  // At end of stream: the last, unterminated line with a '\n' added ("" when none).
  std::string finish();
  size_t pending() const { return partial_.size(); }

 private:
  std::string partial_;
};

// The merged stream's form of `lines` (complete lines): "[rank R] " in front of every line that
// does not carry a rank tag ("[rank N]") already.
std::string tag_lines(const std::string& lines, int rank);

}  // namespace thetad::launch
