// A wrapper's rank output (see worker_io.hpp).
#include "launch/worker_io.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "launch/log_socket.hpp"

namespace thetad::launch {

RankOutput::RankOutput(int rank, Fd rank_fd, Fd node_fd)
    : rank_(rank), rank_fd_(std::move(rank_fd)), node_fd_(std::move(node_fd)) {}

void RankOutput::write_files(const std::string& lines) {
  if (rank_fd_) write_all(rank_fd_.get(), lines);
  if (node_fd_) write_all(node_fd_.get(), lines);
}

void RankOutput::connect_launcher() {
  const char* path = std::getenv(kLogSocketVar);
  const char* token = std::getenv(kLogTokenVar);
  if (!path || !*path || !token) return;  // no launcher of ours on this host: stderr
  std::string why;
  sock_ = connect_log_socket(path, token, rank_, why);
  if (!sock_ && !why.empty())
    write_all(STDERR_FILENO, "[rank " + std::to_string(rank_) + "] thetad-launch: warning: " + why + "\n");
}

void RankOutput::feed(const char* data, size_t n) { emit(buf_.feed(data, n)); }

void RankOutput::finish() { emit(buf_.finish()); }

// Whole lines only, each file in one write: lines of a node's ranks interleave whole. The rank's
// file keeps them as written; the node's file and the merged stream hold several ranks' lines,
// each tagged with its rank and with its control bytes written out.
void RankOutput::emit(const std::string& lines) {
  if (lines.empty()) return;
  if (rank_fd_) write_all(rank_fd_.get(), lines);
  const std::string tagged = escape_controls(tag_lines(lines, rank_));
  if (node_fd_) write_all(node_fd_.get(), tagged);
  if (sock_) {
    const char* p = tagged.data();
    size_t left = tagged.size();
    while (left > 0) {
      ssize_t w = ::send(sock_.get(), p, left, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      p += w;
      left -= size_t(w);
    }
    if (left == 0) return;
    sock_.reset();  // the launcher is gone: the rest goes to stderr
    write_all(STDERR_FILENO, p, left);
    return;
  }
  write_all(STDERR_FILENO, tagged);
}

}  // namespace thetad::launch
