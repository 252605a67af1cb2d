// The launcher's verdict from the exit records (see summary.hpp).
#include "launch/summary.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "common/errors.hpp"
#include "launch/hostfile.hpp"
#include "launch/private_dir.hpp"
#include "launch/sys.hpp"

namespace thetad::launch {

const char* describe_code(int code) {
  switch (code) {
    case kExitOk: return "done";
    case kExitBadInput: return "bad job or input";
    case kExitComm: return "communication failure or lost peer";
    case kExitInterrupted: return "interrupted, checkpointed";
    default: return "error";
  }
}

int rank_of(const std::string& name, const char* ext) {
  if (name.rfind("rank-", 0) != 0) return -1;
  const char* p = name.c_str() + 5;
  char* end = nullptr;
  const long r = std::strtol(p, &end, 10);
  if (end == p || *p < '0' || *p > '9' || r > kMaxRanks || *end != '.' || std::strcmp(end + 1, ext) != 0) return -1;
  return int(r);
}

std::map<int, RankRecord> load_records(int log_dir) {
  std::map<int, RankRecord> out;
  for (const auto& name : list_dir(log_dir)) {
    // rank-R.exit: "CODE TIME NODE"; rank-R.pid: "WRAPPER CHILD HOST NODE".
    const int exit_rank = rank_of(name, "exit"), pid_rank = rank_of(name, "pid");
    std::string text;
    if ((exit_rank < 0 && pid_rank < 0) || !read_file_at(log_dir, name, text)) continue;
    std::istringstream in(text);
    std::string node, skip;
    if (exit_rank >= 0) {
      RankRecord& rec = out[exit_rank];
      if (in >> rec.code >> rec.time) rec.has_exit = true;
      if (in >> node) rec.node = node;
    } else {
      RankRecord& rec = out[pid_rank];
      rec.has_pid = true;
      if (in >> skip >> skip >> skip >> node && rec.node.empty()) rec.node = node;
    }
  }
  return out;
}

namespace {

// Names the node of lost rank `rank`, the ranks of it that died (`rank`, and any other whose
// exit record shows a death by a signal: a whole node lost) and, apart from them, the ranks of
// it that ended because of that (no exit record: mpirun/srun killed their wrappers; or an exit
// of their own, such as 3 or 4). Ranks that finished (exit 0) are only members.
void report_lost_node(const SummaryInput& in, int rank, Verdict& v) {
  auto it = in.ranks.find(rank);
  if (it == in.ranks.end() || it->second.node.empty()) return;
  const std::string& node = it->second.node;
  std::vector<int> members, lost{rank}, stopped;
  for (int r = 0; r < in.ranks_total; ++r) {
    auto m = in.ranks.find(r);
    if (m == in.ranks.end() || m->second.node != node) continue;
    members.push_back(r);
    if (r == rank) continue;
    const RankRecord& rec = m->second;
    if (rec.has_exit && rec.code > 128) lost.push_back(r);
    else if (!rec.has_exit || rec.code != 0) stopped.push_back(r);
  }
  std::sort(lost.begin(), lost.end());
  const auto list = [](const std::vector<int>& ranks) {
    std::string out = ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
    return out;
  };
  std::string line = (in.simulated ? "simulated node " : "node ") + node + " lost " + list(lost);
  if (!stopped.empty()) line += "; " + list(stopped) + " stopped because of it";
  std::string all;
  for (int r : members) all += (all.empty() ? "" : ",") + std::to_string(r);
  v.lines.push_back(line + " (its ranks: " + all + "); log: " + in.log_dir + "/node-" + node + ".log");
}

}  // namespace

Verdict summarize(const SummaryInput& in) {
  Verdict v;
  int first = -1, first_code = 0, done = 0;
  double first_t = 0;
  for (const auto& [r, rec] : in.ranks) {
    if (!rec.has_exit) continue;
    ++done;
    if (rec.code == 0) continue;
    if (first < 0 || rec.time < first_t) first = r, first_code = rec.code, first_t = rec.time;
  }
  // A rank whose wrapper itself was killed leaves no exit record, only its pid file; its death
  // is what made mpirun/srun end the others, with its status (128+N).
  auto lost_wrapper = [&](const RankRecord& rec) {
    return in.launcher_code > 128 && rec.has_pid && !rec.has_exit;
  };
  // On this host the wrappers' connections ended in the order the ranks ended: the first that
  // failed (exit record or lost wrapper) is the cause, the others mostly mpirun's cleanup (a
  // wrapper it killed records nothing).
  bool by_order = false;
  for (int r : in.closed_order) {
    auto it = in.ranks.find(r);
    if (it == in.ranks.end()) continue;
    const RankRecord& rec = it->second;
    if (rec.has_exit ? rec.code != 0 : lost_wrapper(rec)) {
      first = r, first_code = rec.has_exit ? rec.code : in.launcher_code, by_order = true;
      break;
    }
  }
  // Else (ranks of other hosts): the earliest record, unless a wrapper was lost.
  if (!by_order) {
    int lost = -1;
    for (auto it = in.ranks.begin(); lost < 0 && it != in.ranks.end(); ++it)
      if (lost_wrapper(it->second)) lost = it->first;
    if (lost >= 0 && !(in.stopped && first < 0)) first = lost, first_code = in.launcher_code;
  }
  const std::string log = in.log_dir + "/rank-" + std::to_string(first) + ".log";
  if (first >= 0 && first_code > 128) {
    const int sig = first_code - 128;
    v.lines.push_back("rank " + std::to_string(first) + " lost (signal " + std::to_string(sig) + ", " +
                      signal_name(sig) + "); the job ended; log: " + log);
    report_lost_node(in, first, v);
    v.code = kExitComm;
    return v;
  }
  if (first >= 0) {
    v.lines.push_back("rank " + std::to_string(first) + " exited with code " + std::to_string(first_code) +
                      " (" + describe_code(first_code) + "); log: " + log);
    v.code = first_code;
    return v;
  }
  const std::string launch_log = in.log_dir + "/launcher.log";
  if (in.launcher_code != 0) {
    if (in.stopped && in.launcher_code > 128) {
      v.lines.push_back("interrupted; " + in.launcher + " ended with code " + std::to_string(in.launcher_code));
      v.code = kExitInterrupted;
      return v;
    }
    v.lines.push_back(in.launcher + " failed with code " + std::to_string(in.launcher_code) +
                      " (no rank recorded a failure; see " + launch_log + ")");
    v.code = in.launcher_code > 128 ? kExitComm : in.launcher_code;
    return v;
  }
  if (done < in.ranks_total) {
    // Every rank ran on this host: a rank without an exit record never ran. srun can end 0 when
    // a step's tasks fail to launch (seen after a requeue).
    if (!in.host_list && (in.nodes == 1 || in.simulated)) {
      v.lines.push_back(in.launcher + " ended with code 0, but " + std::to_string(in.ranks_total - done) + " of " +
                        std::to_string(in.ranks_total) + " ranks on this host recorded no exit code: they never ran (see " +
                        launch_log + ")");
      v.code = kExitComm;
      return v;
    }
    v.lines.push_back("note: " + std::to_string(done) + " of " + std::to_string(in.ranks_total) +
                      " ranks recorded an exit code here (log dir not shared across hosts?)");
  }
  v.lines.push_back("all " + std::to_string(in.ranks_total) + " rank(s) finished (exit 0)");
  return v;
}

}  // namespace thetad::launch
