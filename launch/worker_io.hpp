// Where a wrapper's rank output goes: the rank's and node's log files, and the merged stream
// (the launcher's log socket on the launcher's host, else the wrapper's stderr, which mpirun or
// srun carries to the launcher).
#pragma once

#include <string>

#include "launch/log_merge.hpp"
#include "launch/sys.hpp"

namespace thetad::launch {

class RankOutput {
 public:
  // `rank_fd`, `node_fd`: the rank's and the node's log files, open to append.
  RankOutput(int rank, Fd rank_fd, Fd node_fd);
  // Writes `lines` (the wrapper's own) to both files as they are.
  void write_files(const std::string& lines);
  // Connects to the launcher's log socket named by THETAD_LAUNCH_LOG_SOCKET (if any), proving
  // itself with THETAD_LAUNCH_LOG_TOKEN once the socket is known to be this user's.
  void connect_launcher();
  // Bytes read from the rank's stderr.
  void feed(const char* data, size_t n);
  // End of the rank's stderr: the last unterminated line.
  void finish();

 private:
  void emit(const std::string& lines);

  int rank_;
  Fd rank_fd_, node_fd_, sock_;
  LineBuffer buf_;
};

}  // namespace thetad::launch
