// An Open MPI hostfile as the launcher's plan reads it: one host per line, `host [slots=N]
// [max_slots=N] ...`, '#' comments. Every count is checked before anything starts: a value that
// is not a whole number from 1 to kMaxRanks is a ConfigError (exit 2) naming the file and line,
// and so is a host on two lines (naming both), which mpirun would not run as the plan's two nodes.
#pragma once

#include <string>
#include <vector>

namespace thetad::launch {

// The most ranks a launch may have (and so any one host's slots): far beyond any real job, it
// keeps every rank count an int that cannot overflow.
inline constexpr long kMaxRanks = 1L << 20;

struct HostfileEntry {
  std::string host;
  int slots = 0;  // slots= (or its synonyms count=, cpu=); 0 when the line gives none
  int line = 0;   // 1-based line number in the file
};

// Reads `path` (a regular file of at most 1 MiB) and parses it; throws ConfigError.
std::vector<HostfileEntry> read_hostfile(const std::string& path);
// Parses hostfile text; `path` names the file in messages. Two lines name one host when mpirun
// makes one node of them (user@ dropped, the name cut at its first dot; localhost, this machine's
// host name and its loopback and interface addresses are this machine) or when they differ only
// in case (one machine to DNS).
std::vector<HostfileEntry> parse_hostfile(const std::string& text, const std::string& path);

// The machine a host name or address means, as one key: what mpirun makes one node of (`user@`
// dropped, a name cut at its first dot, this machine's names and addresses one), in lower case.
// Two entries of a host list with one key are one machine listed twice (refused).
std::string host_key(const std::string& host);

// A count as the launcher takes it from a user: 1 to `max`, decimal digits only; -1 otherwise.
long parse_count(const std::string& s, long max = kMaxRanks);

}  // namespace thetad::launch
