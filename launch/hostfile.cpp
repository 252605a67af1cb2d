// Reading and checking an Open MPI hostfile (see hostfile.hpp).
#include "launch/hostfile.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "common/errors.hpp"
#include "common/text.hpp"

namespace thetad::launch {

namespace {

constexpr size_t kMaxHostfileBytes = size_t(1) << 20;

bool is_count_key(const std::string& k) { return k == "slots" || k == "count" || k == "cpu"; }
bool is_max_key(const std::string& k) { return k == "max_slots" || k == "max-slots" || k == "maxslots"; }

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

// An address in inet_ntop's spelling ("0:0::1" is "::1"), "" when `s` is not one.
std::string canonical_address(const std::string& s) {
  unsigned char buf[sizeof(in6_addr)];
  char out[INET6_ADDRSTRLEN] = {};
  for (int af : {AF_INET, AF_INET6})
    if (::inet_pton(af, s.c_str(), buf) == 1 && ::inet_ntop(af, buf, out, sizeof out)) return out;
  return "";
}

// What mpirun counts as this machine: its host name (short), loopback, every interface's address.
struct ThisMachine {
  std::string name;
  std::set<std::string> addresses;
};

ThisMachine this_machine() {
  ThisMachine m;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0) m.name = lower(std::string(name).substr(0, std::strcspn(name, ".")));
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (const ifaddrs* i = list; i; i = i->ifa_next) {
      if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
      char out[INET6_ADDRSTRLEN] = {};
      const void* a = i->ifa_addr->sa_family == AF_INET
                          ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr)
                          : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr);
      if (::inet_ntop(i->ifa_addr->sa_family, a, out, sizeof out)) m.addresses.insert(out);
    }
    ::freeifaddrs(list);
  }
  return m;
}

// The node Open MPI (4.1's ORTE, 5's PRRTE) makes of a hostfile name: `user@` dropped, a name cut
// at its first dot (nodeA., nodeA.cluster.example: nodeA; its default, orte_keep_fqdn_hostnames
// off), an address as it is, and any name of this machine (localhost, its host name, a loopback
// or interface address) this machine. mpirun compares these case-sensitively; the launcher
// lowers them after (`lower`), since DNS names ignore case and NODEA is nodeA's machine.
std::string node_name(const std::string& host, const ThisMachine& self) {
  const size_t at = host.rfind('@');
  const std::string name = at == std::string::npos || at + 1 == host.size() ? host : host.substr(at + 1);
  const std::string address = canonical_address(name);
  if (!address.empty()) {
    const bool loopback = address == "::1" || address.rfind("127.", 0) == 0;
    return loopback || self.addresses.count(address) ? "localhost" : address;
  }
  const std::string short_name = name.substr(0, name.find('.'));
  if (lower(short_name) == "localhost" || (!self.name.empty() && lower(short_name) == self.name)) return "localhost";
  return short_name;
}

}  // namespace

std::string host_key(const std::string& host) { return lower(node_name(host, this_machine())); }

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
  // A host listed twice is refused, whatever its slots=: the plan makes a node of each line, and
  // Open MPI does not. mpirun (4.1's orte/util/hostfile/hostfile.c, 5's PRRTE
  // src/util/hostfile/hostfile.c) makes one node of the lines that name one host: a repeated
  // line without slots= adds one slot to it (`nodeA` twice: one node of 2 slots), a repeated line
  // with slots= is its error "multiple definitions of the slot count" (help-hostfile.txt,
  // slots-given: list a node once per slot, or once with slots=N). That error used to end a
  // launch planned as two nodes with only "no rank recorded a failure". Merging with the slots
  // summed (what Open MPI 1.x did) matches neither, and a merged bare line is not N ranks either:
  // with --map-by ppr:N:node mpirun runs N ranks on the one node where the plan counted 2N.
  const ThisMachine self = this_machine();
  std::map<std::string, size_t> seen;  // lowered node -> its line in `out`
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
    const std::string node = node_name(e.host, self);
    const auto first = seen.emplace(lower(node), out.size());
    if (!first.second) {
      const HostfileEntry& before = out[first.first->second];
      throw ConfigError("hostfile '" + path + "' lines " + std::to_string(before.line) + " and " +
                        std::to_string(line) + " both name host '" + printable(before.host) + "'" +
                        (e.host == before.host ? "" : " (line " + std::to_string(line) + ": '" + printable(e.host) + "')") +
                        ": list each host once, with slots=N for its ranks (" +
                        (node_name(before.host, self) == node ? "mpirun takes both lines for one node)"
                                                              : "host names ignore case: both lines are one machine)"));
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
