// posix_spawn with the signal state reset (see spawn.hpp).
#include "launch/spawn.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "common/errors.hpp"

extern char** environ;

namespace thetad::launch {

namespace {

// posix_spawn's attribute and file-action objects, destroyed on every path.
struct SpawnObjects {
  posix_spawnattr_t attr;
  posix_spawn_file_actions_t actions;
  SpawnObjects() {
    posix_spawnattr_init(&attr);
    posix_spawn_file_actions_init(&actions);
  }
  ~SpawnObjects() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
};

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

Child spawn(const SpawnSpec& spec) {
  THETAD_CHECK(!spec.argv.empty(), InternalError, "spawn without a command");
  SpawnObjects o;
  sigset_t none, all;
  sigemptyset(&none);
  for (int sig : spec.blocked) sigaddset(&none, sig);
  sigfillset(&all);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  if (spec.new_session) flags |= POSIX_SPAWN_SETSID;
  posix_spawnattr_setflags(&o.attr, flags);
  posix_spawnattr_setsigmask(&o.attr, &none);
  posix_spawnattr_setsigdefault(&o.attr, &all);
  for (const auto& [from, to] : spec.dup2s) posix_spawn_file_actions_adddup2(&o.actions, from, to);
  std::vector<char*> argv = c_strings(spec.argv);
  std::vector<char*> envp = c_strings(spec.env);
  char** env = spec.env.empty() ? environ : envp.data();
  Child c;
  int err = ::posix_spawnp(&c.pid, argv[0], &o.actions, &o.attr, argv.data(), env);
  if (err != 0)
    throw Error("cannot start '" + spec.argv[0] + "': " + std::strerror(err));
  c.pidfd = pidfd_open(c.pid);
  return c;
}

bool reap(pid_t pid, int& code) {
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return false;
  if (r < 0) {  // not our child any more (reaped elsewhere): report it as gone
    code = 1;
    return true;
  }
  code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return true;
}

void make_pipe(Fd ends[2]) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  ends[0].reset(p[0]);
  ends[1].reset(p[1]);
}

}  // namespace thetad::launch
