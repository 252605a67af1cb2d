// The launcher's log socket: the channel over which the wrappers of the launcher's host send
// their ranks' lines. A unix socket in a directory of its own (mkdtemp: 0700, this user's),
// never in the abstract namespace (listed in /proc/net/unix, where any local user could connect
// or take the name first). Each end checks the other's uid (SO_PEERCRED), and a wrapper proves
// itself with a random token before any of its bytes count: another user's process can neither
// add lines to the merged log nor count as a rank, nor receive a rank's output.
#pragma once

#include <sys/types.h>

#include <string>

#include "launch/sys.hpp"

namespace thetad::launch {

// The environment variables naming the socket's path and the token (the launcher sets them for
// mpirun's local ranks only; a wrapper removes them from thetad's environment).
inline constexpr const char* kLogSocketVar = "THETAD_LAUNCH_LOG_SOCKET";
inline constexpr const char* kLogTokenVar = "THETAD_LAUNCH_LOG_TOKEN";
// The longest hello a connection may send before it is refused: "<token> <rank>\n".
inline constexpr size_t kMaxHelloBytes = 128;
// How long a connection may take to send its hello.
inline constexpr double kHelloWaitS = 10;

class LogListener {
 public:
  // Creates the directory and the listening socket; valid() is false when it cannot (the
  // wrappers then write to their stderr, which mpirun carries), with why() saying so.
  LogListener();
  ~LogListener();  // removes the socket and its directory
  LogListener(const LogListener&) = delete;
  LogListener& operator=(const LogListener&) = delete;

  bool valid() const { return bool(fd_); }
  const std::string& why() const { return why_; }
  int fd() const { return fd_.get(); }
  const std::string& dir() const { return dir_; }
  const std::string& path() const { return path_; }
  const std::string& token() const { return token_; }

  // A connection waiting to be accepted: its fd and peer (SO_PEERCRED), or an invalid Fd when
  // none waits. A peer of another uid is closed here and reported in `refused`.
  struct Peer {
    Fd fd;
    pid_t pid = -1;
    uid_t uid = 0;
  };
  Peer accept(std::string& refused);

 private:
  Fd fd_;
  std::string dir_, path_, token_, why_;
};

// The hello a wrapper sends first.
std::string hello_line(const std::string& token, int rank);
// The rank a hello names (from 0 to ranks-1), or -1 with `why`: a wrong or missing token, a
// rank out of range. `line` is the hello without its '\n'. The token is compared in constant
// time.
int check_hello(const std::string& line, const std::string& token, int ranks, std::string& why);

// A wrapper's side: connects to `path`, checks that the listener is this user's (SO_PEERCRED)
// before sending anything, and sends the hello. An invalid Fd with `why` otherwise ("" when no
// socket is there: another host).
Fd connect_log_socket(const std::string& path, const std::string& token, int rank, std::string& why);

}  // namespace thetad::launch
