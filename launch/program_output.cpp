// A helper program's stdout (see program_output.hpp).
#include "launch/program_output.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "launch/spawn.hpp"

namespace thetad::launch {

std::string program_output(const std::vector<std::string>& argv) {
  Fd out[2];
  make_pipe(out);
  Fd null(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  SpawnSpec spec;
  // Through `--exec-child` (worker.hpp): the helper dies with this process, also when a stop
  // ends the launcher while the helper still runs (preflight.hpp).
  spec.argv = {self_exe(), "--exec-child", std::to_string(::getpid()), "--"};
  spec.argv.insert(spec.argv.end(), argv.begin(), argv.end());
  spec.dup2s = {{out[1].get(), 1}, {null.get(), 2}};
  Child c;
  try {
    c = spawn(spec);
  } catch (const std::exception&) {
    return "";
  }
  out[1].reset();
  std::string text;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(out[0].get(), buf, sizeof buf);
    if (n > 0) text.append(buf, size_t(n));
    else if (n < 0 && errno == EINTR) continue;
    else break;
  }
  int status;
  while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
  }
  return text;
}

}  // namespace thetad::launch
