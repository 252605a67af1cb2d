// The launcher's verdict once mpirun/srun has ended: from the ranks' exit records (and the pid
// files of wrappers that never wrote one), the first failing rank, a lost rank and its node, the
// launcher's exit code and the lines it prints.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace thetad::launch {

struct RankRecord {
  bool has_exit = false;  // rank-R.exit
  int code = 0;
  double time = 0;        // when the wrapper recorded it
  bool has_pid = false;   // rank-R.pid: its wrapper started and never finished
  std::string node;       // the node its wrapper named in its records
};

struct SummaryInput {
  std::map<int, RankRecord> ranks;
  std::vector<int> closed_order;  // this host's wrappers in the order their connections ended
  int ranks_total = 1;
  int nodes = 1;
  bool host_list = false;
  bool simulated = false;
  std::string launcher = "mpirun";
  int launcher_code = 0;
  bool stopped = false;
  std::string log_dir;
};

struct Verdict {
  int code = 0;
  std::vector<std::string> lines;  // launcher messages, in order
};

// Reads the log dir's (`log_dir`: its descriptor) rank-R.exit and rank-R.pid records.
std::map<int, RankRecord> load_records(int log_dir);

// "rank-12.exit" -> 12 with `ext` "exit"; -1 for any other name.
int rank_of(const std::string& name, const char* ext);

Verdict summarize(const SummaryInput& in);

// "done", "interrupted, checkpointed", ... for an exit code.
const char* describe_code(int code);

}  // namespace thetad::launch
