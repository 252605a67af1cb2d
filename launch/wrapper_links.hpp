// The launcher's side of its host's rank wrappers: the log socket (log_socket.hpp) and one
// connection per wrapper. A connection counts (as a rank that is up, a pid to stop, a source of
// lines) only once it has proven itself: this user's (checked at accept), the launch's token and
// a rank of the launch in its first line, within kHelloWaitS and kMaxHelloBytes. Connections
// waiting for that are few (kMaxPending) and their bytes go nowhere; every line is bounded
// (kMaxMergedLineBytes).
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "launch/log_merge.hpp"
#include "launch/log_socket.hpp"
#include "launch/sys.hpp"

namespace thetad::launch {

class WrapperLinks {
 public:
  using Sink = std::function<void(const std::string&)>;
  // `ranks`: the launch's; `lines`: where whole lines go (the merged stream); `log`: launcher
  // messages (refused connections).
  WrapperLinks(int ranks, Sink lines, Sink log);

  // Opens the socket and names it and the token in this process's environment for mpirun to
  // pass on to its local ranks; hide() removes them again once mpirun has started.
  void open();
  void hide();

  // Appends the descriptors to poll (the socket, then each connection); handle() takes the
  // results from index `first` on, in the same order.
  void add_poll_fds(std::vector<pollfd>& fds) const;
  void handle(const std::vector<pollfd>& fds, size_t first, double now);
  // Milliseconds until the earliest hello is due (-1: none waits), and the refusal of those late.
  int next_deadline_ms(double now) const;
  void expire(double now);

  // SIGTERM to every proven wrapper now, and to any that proves itself later.
  void stop_all();
  std::set<int> ranks() const;   // of the proven wrappers
  std::set<pid_t> pids() const;  // of the proven wrappers
  size_t proven() const;
  const std::vector<int>& closed_order() const { return closed_order_; }

  static constexpr size_t kMaxPending = 64;

 private:
  struct Link {
    Fd fd;
    pid_t pid = -1;
    Fd pidfd;
    int rank = -1;  // set once proven
    double deadline = 0;
    std::string hello;
    LineBuffer buf{kMaxMergedLineBytes};
  };
  void accept_all(double now);
  bool read(Link& l);  // false: closed (or refused)
  bool prove(Link& l, std::string rest);
  void refuse(const std::string& why);

  int ranks_;
  Sink lines_, log_;
  std::unique_ptr<LogListener> listener_;
  std::vector<std::unique_ptr<Link>> links_;
  std::vector<int> closed_order_;
  bool stop_sent_ = false;
  int refusals_ = 0;
};

}  // namespace thetad::launch
