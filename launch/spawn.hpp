// Starting children with posix_spawn: every signal at its default and none blocked (the
// launcher blocks its signals for its signalfd; a child must not inherit that), optionally in a
// session of its own, with chosen descriptors moved into place.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "launch/sys.hpp"

namespace thetad::launch {

struct SpawnSpec {
  std::vector<std::string> argv;           // argv[0] is looked up on PATH when it has no '/'
  std::vector<std::string> env;            // "K=V" entries; empty: this process's environment
  bool new_session = false;                // setsid(): its own session and process group
  std::vector<std::pair<int, int>> dup2s;  // (from, to): `from` appears as `to` in the child
  std::vector<int> blocked;                // signals the child starts with blocked (none else)
};

struct Child {
  pid_t pid = -1;
  Fd pidfd;  // readable once the child has ended (may be invalid on old kernels)
};

// Starts the child; throws thetad::Error naming the program when it cannot be started.
Child spawn(const SpawnSpec& spec);

// Collects the child's status without waiting: true and `code` (exit code, or 128+N for a child
// killed by signal N) when it has ended.
bool reap(pid_t pid, int& code);

// A pipe, both ends close-on-exec: [0] reads, [1] writes.
void make_pipe(Fd ends[2]);

}  // namespace thetad::launch
