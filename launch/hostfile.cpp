// Reading and checking an Open MPI hostfile (see hostfile.hpp).
#include "launch/hostfile.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "common/errors.hpp"
#include "common/text.hpp"

namespace thetad::launch {

namespace {

constexpr size_t kMaxHostfileBytes = size_t(1) << 20;

bool is_count_key(const std::string& k) { return k == "slots" || k == "count" || k == "cpu"; }
bool is_max_key(const std::string& k) { return k == "max_slots" || k == "max-slots" || k == "maxslots"; }

}  // namespace

long parse_count(const std::string& s, long max) {
  // At most as many digits as `max` has: no overflow on the way (2147483648, 99999999999).
  if (s.empty() || s.size() > std::to_string(max).size() || s[0] < '1' || s[0] > '9') return -1;
  long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v <= max ? v : -1;
}

std::vector<HostfileEntry> parse_hostfile(const std::string& text, const std::string& path) {
  std::vector<HostfileEntry> out;
  std::istringstream in(text);
  std::string raw;
  for (int line = 1; std::getline(in, raw); ++line) {
    const std::string where = "hostfile '" + path + "' line " + std::to_string(line) + ": ";
    std::string s = raw.substr(0, raw.find('#'));
    // "slots = 4" is "slots=4" to Open MPI too.
    for (size_t at; (at = s.find(" =")) != std::string::npos || (at = s.find("\t=")) != std::string::npos;)
      s.erase(at, 1);
    for (size_t at; (at = s.find("= ")) != std::string::npos || (at = s.find("=\t")) != std::string::npos;)
      s.erase(at + 1, 1);
    std::istringstream words(s);
    HostfileEntry e;
    e.line = line;
    if (!(words >> e.host)) continue;  // blank or comment
    if (e.host.find('=') != std::string::npos)
      throw ConfigError(where + "'" + printable(e.host) + "' is not a host name (want: host [slots=N])");
    for (std::string w; words >> w;) {
      const size_t eq = w.find('=');
      const std::string key = w.substr(0, eq), value = eq == std::string::npos ? "" : w.substr(eq + 1);
      if (!is_count_key(key) && !is_max_key(key)) continue;  // mpirun's to judge
      const long n = parse_count(value);
      if (n < 0)
        throw ConfigError(where + key + "=" + printable(value) + " is not a whole number from 1 to " +
                          std::to_string(kMaxRanks));
      if (is_count_key(key)) e.slots = int(n);
    }
    out.push_back(e);
  }
  return out;
}

std::vector<HostfileEntry> read_hostfile(const std::string& path) {
  // Checked before it is opened: a FIFO would block the open until a writer comes.
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    throw ConfigError("hostfile '" + path + "': " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw ConfigError("hostfile '" + path + "' is not a regular file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw ConfigError("hostfile '" + path + "' not readable: " + std::strerror(errno));
  std::string text(kMaxHostfileBytes + 1, '\0');
  size_t got = 0;
  for (ssize_t r; got < text.size() && (r = ::read(fd, &text[got], text.size() - got)) != 0;) {
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      throw ConfigError("hostfile '" + path + "': " + std::strerror(err));
    }
    got += size_t(r);
  }
  ::close(fd);
  if (got > kMaxHostfileBytes) throw ConfigError("hostfile '" + path + "' is larger than 1 MiB: not a hostfile");
  text.resize(got);
  return parse_hostfile(text, path);
}

}  // namespace thetad::launch
