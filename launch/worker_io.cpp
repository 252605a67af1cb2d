// A wrapper's rank output (see worker_io.hpp).
#include "launch/worker_io.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "launch/worker.hpp"

namespace thetad::launch {

RankOutput::RankOutput(int rank, std::string rank_file, std::string node_file)
    : rank_(rank), rank_file_(std::move(rank_file)), node_file_(std::move(node_file)) {
  rank_fd_.reset(::open(rank_file_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  node_fd_.reset(::open(node_file_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
}

void RankOutput::connect_launcher() {
  const char* name = std::getenv(kLogSocketVar);
  if (!name || !*name || std::strlen(name) + 1 >= sizeof(sockaddr_un::sun_path)) return;
  Fd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name, std::strlen(name));  // abstract: no file to clean up
  socklen_t len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + std::strlen(name));
  if (!s || ::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) return;  // another host
  const std::string hello = std::to_string(rank_) + "\n";
  if (::send(s.get(), hello.data(), hello.size(), MSG_NOSIGNAL) == ssize_t(hello.size())) sock_ = std::move(s);
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
