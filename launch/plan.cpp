// Building the launcher's plan (see plan.hpp): the same checks, defaults and mpirun/srun flags
// as docs/deploy.md describes.
#include "launch/plan.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <cerrno>
#include <regex>
#include <sstream>

#include "common/errors.hpp"
#include "config/loader.hpp"
#include "launch/hostfile.hpp"
#include "launch/private_dir.hpp"
#include "launch/program_output.hpp"
#include "launch/sys.hpp"

extern char** environ;

namespace thetad::launch {

namespace {

// The job's checked bytes in the log dir, which the ranks read (thetad run --checked-copy).
constexpr const char* kCheckedJob = "job.checked.yaml";

std::string env(const char* k) {
  const char* v = std::getenv(k);
  return v ? v : "";
}
bool env_set(const char* k) { return std::getenv(k) != nullptr; }

bool executable_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

// `command -v`: the path of `prog` (as given when it has a '/'), "" when not found.
std::string find_program(const std::string& prog) {
  if (prog.find('/') != std::string::npos) return executable_file(prog) ? prog : "";
  std::stringstream path(env("PATH"));
  std::string dir;
  while (std::getline(path, dir, ':'))
    if (!dir.empty() && executable_file(dir + "/" + prog)) return dir + "/" + prog;
  return "";
}

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

std::vector<std::string> split_keep_empty(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t p = s.find(sep, start);
    out.push_back(s.substr(start, p - start));
    if (p == std::string::npos) return out;
    start = p + 1;
  }
}

// An explicit choice (--thetad, THETAD_BIN) is used or refused, never silently replaced.
std::string find_thetad(const Options& o, const std::string& self_dir) {
  for (const std::string& cand : {o.thetad, env("THETAD_BIN")}) {
    if (cand.empty()) continue;
    if (!executable_file(cand)) throw Error("thetad binary '" + cand + "' is not an executable file");
    return absolute_path(cand, true);
  }
  for (const std::string& cand : {self_dir + "/../daemon/thetad", self_dir + "/thetad"})
    if (executable_file(cand)) return absolute_path(cand, true);
  std::string on_path = find_program("thetad");
  if (!on_path.empty()) return absolute_path(on_path, true);
  throw Error("no thetad binary: pass --thetad PATH, set THETAD_BIN, build into " +
              absolute_path(self_dir + "/..", false) + ", or put thetad on PATH");
}

// Checks the job with thetad's own loader; returns its name.
std::string check_job(const Plan& p, const Options& o) {
  config::LoadOptions lo;
  lo.overrides = o.overrides;
  lo.cuda_build = p.gpus > 0;  // NCCL needs GPUs; thetad checks its build itself when it starts
  try {
    config::Job job = config::load_job_from_string(p.job_text, p.job, lo);
    for (const auto& w : job.warnings) std::fprintf(stderr, "thetad-launch: warning: %s\n", w.c_str());
    return job.name;
  } catch (const config::JobError& e) {
    for (const auto& m : e.messages()) std::fprintf(stderr, "thetad-launch: error: %s\n", m.c_str());
    throw ConfigError("job '" + o.job + "' is invalid (" + std::to_string(e.messages().size()) +
                      " error(s)); nothing was started");
  } catch (const ConfigError& e) {
    throw ConfigError("job '" + o.job + "' is invalid: " + e.what() + "; nothing was started");
  }
}

void add_mpirun_flags(Plan& p, const Options& o, bool uniform, const std::string& sim) {
  const std::string mpirun = env_set("THETAD_MPIRUN") ? env("THETAD_MPIRUN") : "mpirun";
  if (find_program(mpirun).empty())
    throw Error("'" + mpirun + "' not found (install openmpi-bin or set THETAD_MPIRUN)");
  if (::geteuid() == 0) {
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
  auto& c = p.command;
  c = {mpirun, "-np", std::to_string(p.ranks)};
  if (!o.hostfile.empty()) c.insert(c.end(), {"--hostfile", absolute_path(o.hostfile, true)});
  if (!o.hosts.empty()) {
    std::string spec;
    for (const auto& h : split_keep_empty(o.hosts, ',')) {
      size_t colon = h.find(':');
      spec += (spec.empty() ? "" : ",") + h.substr(0, colon) + ":" +
              (colon == std::string::npos ? std::to_string(p.nproc) : h.substr(colon + 1));
    }
    c.insert(c.end(), {"--host", spec});
  }
  const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  // On one host (simulated nodes included) every rank shares its cores.
  if (p.nproc > cores || (!p.host_list && p.ranks > cores)) c.push_back("--oversubscribe");
  if (env_set("THETAD_MPIRUN_BIND")) {
    for (auto& w : split_words(env("THETAD_MPIRUN_BIND"))) c.push_back(w);
  } else if (!sim.empty()) {
    c.insert(c.end(), {"--bind-to", "none"});  // the simulated nodes share this host
  } else if (p.gpus > 0 && p.nproc <= cores && uniform) {
    c.insert(c.end(), {"--map-by", "ppr:" + std::to_string(p.nproc) + ":node", "--bind-to", "numa"});
  } else if (uniform && p.host_list) {
    c.insert(c.end(), {"--map-by", "ppr:" + std::to_string(p.nproc) + ":node", "--bind-to", "none"});
  } else {
    c.insert(c.end(), {"--bind-to", "none"});
  }
  if (env_set("THETAD_MPIRUN_ARGS")) {
    for (auto& w : split_words(env("THETAD_MPIRUN_ARGS"))) c.push_back(w);
  } else {
    int nonlo = 0;
    if (DIR* d = ::opendir("/sys/class/net")) {
      while (dirent* e = ::readdir(d))
        if (e->d_name[0] != '.' && std::string(e->d_name) != "lo") ++nonlo;
      ::closedir(d);
    }
    for (auto& w : mpirun_network_flags(!p.host_list, nonlo == 0)) c.push_back(w);
  }
  std::vector<std::string> pass;
  static const std::regex kPassed("^(NCCL_|THETAD_|NVSHMEM_|TORCH_SYMM_MEM_).*");
  for (char** e = environ; *e; ++e) {
    std::string name(*e, std::strchr(*e, '=') ? size_t(std::strchr(*e, '=') - *e) : std::strlen(*e));
    // The log socket's path and token are for this host's ranks only (log_socket.hpp).
    if (std::regex_match(name, kPassed) && name.rfind("THETAD_LAUNCH_LOG_", 0) != 0) pass.push_back(name);
  }
  std::sort(pass.begin(), pass.end());
  for (const char* v : {"CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "LD_LIBRARY_PATH"})
    if (env_set(v)) pass.push_back(v);
  for (auto& v : pass) c.insert(c.end(), {"-x", v});
}

void add_srun_flags(Plan& p, const Options& o) {
  if (find_program("srun").empty() && !o.dry_run) throw Error("srun not found");
  auto& c = p.command;
  c = {"srun", "--mpi=pmix", "--kill-on-bad-exit=1"};
  const std::string per_node = env("SLURM_NTASKS_PER_NODE");
  if (!o.nproc.empty() || per_node.empty()) {
    c.push_back("--ntasks-per-node=" + std::to_string(p.nproc));
    if (p.gpus > 0) c.push_back("--gpus-per-task=1");
  }
  if (!per_node.empty() && o.nproc.empty()) p.nproc = std::atoi(per_node.c_str());  // "8(x2)" -> 8
  std::string nodes = env_set("SLURM_JOB_NUM_NODES") ? env("SLURM_JOB_NUM_NODES") : env("SLURM_NNODES");
  p.nodes = nodes.empty() ? 1 : std::max(1, std::atoi(nodes.c_str()));
  p.ranks = p.nodes * p.nproc;
  for (auto& w : split_words(env("THETAD_SRUN_ARGS"))) c.push_back(w);
}

// How many ranks, where: per node --nproc-per-node, else the hostfile's slots=, else one per
// GPU (of a simulated node's share), else 2; over the hostfile's or --hosts' hosts or the
// simulated nodes. Every count is checked (at most kMaxRanks in all) before anything starts.
// Returns whether every node runs the same number of ranks.
bool count_ranks(Plan& p, const Options& o) {
  const std::vector<HostfileEntry> hosts = o.hostfile.empty() ? std::vector<HostfileEntry>{} : read_hostfile(o.hostfile);
  const bool given = !o.nproc.empty();
  if (given) {
    p.nproc = int(parse_count(o.nproc));
  } else if (!hosts.empty() && hosts[0].slots > 0) {
    p.nproc = hosts[0].slots;
  } else {
    p.nproc = p.gpus > 0 ? p.gpus : 2;
    // Simulated nodes share this host's GPUs: one rank per GPU of a node's share.
    const long sim = o.simulate_nodes.empty() ? 0 : parse_count(o.simulate_nodes);
    if (sim > 0 && p.gpus >= sim) p.nproc = int(p.gpus / sim);
  }
  long ranks = p.nproc, nodes = 1;
  bool uniform = true;
  if (!o.hostfile.empty()) {
    if (hosts.empty()) throw ConfigError("hostfile '" + o.hostfile + "' lists no hosts");
    ranks = 0;
    for (const auto& h : hosts) {  // each host its slots=, unless --nproc-per-node says
      const long n = !given && h.slots > 0 ? h.slots : p.nproc;
      uniform = uniform && n == p.nproc;
      ranks += n;
    }
    nodes = long(hosts.size());
    p.host_list = true;
  } else if (!o.hosts.empty()) {
    static const std::regex kHost("^[A-Za-z0-9._-]+$");
    ranks = nodes = 0;
    const std::string what = "--hosts '" + o.hosts + "': ";
    std::map<std::string, std::string> seen;  // host_key -> its entry
    for (const auto& h : split_keep_empty(o.hosts, ',')) {
      if (h.empty()) throw ConfigError(what + "empty entry (want host[:n],host[:n],...)");
      size_t colon = h.find(':');
      std::string name = h.substr(0, colon);
      std::string n = colon == std::string::npos ? std::to_string(p.nproc) : h.substr(colon + 1);
      if (name.empty()) throw ConfigError(what + "entry '" + h + "' has no host name (want host[:n])");
      if (!std::regex_match(name, kHost)) throw ConfigError(what + "bad host name '" + name + "' in entry '" + h + "'");
      const auto first = seen.emplace(host_key(name), h);
      if (!first.second)  // mpirun makes one node of them, where the plan would count two
        throw ConfigError(what + "entries '" + first.first->second + "' and '" + h +
                          "' name one host: list each host once, with :n for its ranks");
      const long k = parse_count(n);
      if (k < 0)
        throw ConfigError(what + "entry '" + h + "' needs a number of ranks from 1 to " + std::to_string(kMaxRanks) +
                          " after ':', got '" + n + "'");
      uniform = uniform && k == p.nproc;
      ranks += k;
      nodes += 1;
    }
    p.host_list = true;
  } else if (!o.simulate_nodes.empty()) {
    nodes = parse_count(o.simulate_nodes);
    ranks = nodes * p.nproc;
  }
  if (ranks > kMaxRanks)
    throw ConfigError(std::to_string(ranks) + " ranks (" + std::to_string(nodes) + " node(s)): more than the " +
                      std::to_string(kMaxRanks) + " a launch may have");
  p.ranks = int(ranks);
  p.nodes = int(nodes);
  return uniform;
}

}  // namespace

Plan make_plan(const Options& o) {
  Plan p;
  p.self = self_exe();
  const std::string self_dir = p.self.substr(0, p.self.rfind('/'));
  // Checked before anything opens it: a FIFO would block the open until a writer comes.
  struct stat st;
  if (::stat(o.job.c_str(), &st) != 0 || ::access(o.job.c_str(), R_OK) != 0)
    throw ConfigError("job file '" + o.job + "' not found or not readable: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw ConfigError("job file '" + o.job + "' is not a regular file: a job is a YAML file");
  p.job = absolute_path(o.job, true);
  if (!o.nproc.empty() && parse_count(o.nproc) < 0)
    throw ConfigError("--nproc-per-node must be a whole number from 1 to " + std::to_string(kMaxRanks) + ", got '" +
                      o.nproc + "'");
  if (!o.hostfile.empty() && !o.hosts.empty())
    throw ConfigError("--hostfile and --hosts exclude each other");
  if (!o.simulate_nodes.empty()) {
    if (parse_count(o.simulate_nodes) < 0)
      throw ConfigError("--simulate-nodes must be a whole number from 1 to " + std::to_string(kMaxRanks) + ", got '" +
                        o.simulate_nodes + "'");
    if (!o.hostfile.empty() || !o.hosts.empty())
      throw ConfigError("--simulate-nodes simulates nodes on this one host: it excludes --hostfile and --hosts");
  }
  if (o.launcher == "auto")
    p.launcher = env_set("SLURM_JOB_ID") && !env("SLURM_JOB_ID").empty() ? "srun" : "mpirun";
  else if (o.launcher == "mpirun" || o.launcher == "srun")
    p.launcher = o.launcher;
  else
    throw ConfigError("--launcher must be auto, mpirun or srun");
  if (!o.simulate_nodes.empty() && p.launcher != "mpirun")
    throw ConfigError("--simulate-nodes runs under mpirun on one host (got --launcher " + p.launcher + ")");

  p.thetad = find_thetad(o, self_dir);
  p.gpus = count_gpus();
  try {
    p.job_text = config::read_job_file(p.job);
  } catch (const config::JobError& e) {
    for (const auto& m : e.messages()) std::fprintf(stderr, "thetad-launch: error: %s\n", m.c_str());
    throw ConfigError("job '" + o.job + "' cannot be read; nothing was started");
  }
  p.job_name = check_job(p, o);
  p.validate_note = {"thetad", "validate", p.job};
  for (const auto& s : o.overrides) p.validate_note.insert(p.validate_note.end(), {"--set", s});

  bool uniform = count_ranks(p, o);
  // Simulated nodes (comm/node_split.hpp): from --simulate-nodes, or THETAD_SIMULATE_NODES set by
  // hand (passed on to the ranks like every THETAD_*), checked here so a bad value starts nothing.
  const std::string sim = !o.simulate_nodes.empty() ? o.simulate_nodes : env("THETAD_SIMULATE_NODES");
  if (!sim.empty()) {
    const long n = std::max(0L, parse_count(sim));
    if (n == 0 || n > p.ranks || p.ranks % n != 0)
      throw ConfigError("THETAD_SIMULATE_NODES='" + sim + "': simulated nodes must be a whole number from 1 to the " +
                        std::to_string(p.ranks) +
                        " ranks that divides it (use --simulate-nodes N with --nproc-per-node ranks per node)");
    ::setenv("THETAD_SIMULATE_NODES", sim.c_str(), 1);
    if (o.simulate_nodes.empty()) p.nodes = int(n);
    p.simulated = true;
  }
  p.log_dir = o.log_dir.empty() ? "runs/" + p.job_name + "/logs" : o.log_dir;
  // Created 0700 where missing, and only as this user's own (private_dir.hpp): the ranks' logs
  // and records must not land where another user can plant links or forge them.
  if (!o.dry_run) {
    // The ranks run the job that was checked: its bytes, copied here, not the file read again
    // (an edit in between would run a job nobody checked).
    const Fd dir = open_private_dir(p.log_dir, true, "log dir");
    if (!replace_file_at(dir.get(), kCheckedJob, p.job_text))
      throw Error("log dir " + p.log_dir + ": cannot write " + kCheckedJob + ": " + std::strerror(errno));
  }
  p.log_dir = normalize_path(p.log_dir);
  if (!o.dry_run) p.checked_copy = p.log_dir + "/" + kCheckedJob;
  // OMP threads per rank: 1 on CPU-only machines (the ranks share the cores), else cores/ranks.
  if (env("OMP_NUM_THREADS").empty()) {
    const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
    const long t = p.gpus > 0 ? std::max(1L, cores / p.nproc) : 1;
    ::setenv("OMP_NUM_THREADS", std::to_string(t).c_str(), 1);
  }
  // NVLink multicast stays off (it can take a host's GPUs down); a user may still set it.
  if (p.gpus > 0) {
    ::setenv("NCCL_NVLS_ENABLE", "0", 0);
    ::setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 0);
    ::setenv("NVSHMEM_DISABLE_NVLS", "1", 0);
  }
  // NCCL's bootstrap and socket transport listen, unauthenticated, on the interface
  // NCCL_SOCKET_IFNAME names (docs/deploy.md, Security): ranks that all run on this host keep
  // them on loopback, unless the user named one.
  if (p.gpus > 0 && p.launcher == "mpirun" && !p.host_list && env("NCCL_SOCKET_IFNAME").empty())
    ::setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  if (p.launcher == "mpirun")
    add_mpirun_flags(p, o, uniform, sim);
  else
    add_srun_flags(p, o);
  p.command.insert(p.command.end(), {p.self, "--worker", p.log_dir, "--", p.thetad, "run", p.job});
  if (!p.checked_copy.empty()) p.command.insert(p.command.end(), {"--checked-copy", p.checked_copy});
  p.command.insert(p.command.end(), o.run_args.begin(), o.run_args.end());
  return p;
}

std::vector<std::string> mpirun_network_flags(bool one_host, bool loopback_only) {
  // One host (simulated nodes included): shared memory only. A TCP BTL would have every rank
  // listen on every interface, unauthenticated; mpirun's own out-of-band channel stays on lo.
  if (one_host)
    return {"--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo", "--mca", "pml", "ob1",
            "--mca", "osc", "^ucx"};
  // Hosts listed on a machine with loopback only: they can only be this one, reached over lo.
  if (loopback_only)
    return {"--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include",
            "lo", "--mca", "pml", "ob1", "--mca", "osc", "^ucx"};
  return {};  // several hosts: MPI's own choice of fabric (THETAD_MPIRUN_ARGS to confine it)
}

int count_gpus() {
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::string s;
    for (const char* c = v; *c; ++c)
      if (*c != ' ') s += *c;
    if (s.empty() || s == "-1" || s == "none" || s == "NoDevFiles") return 0;
    return int(split_keep_empty(s, ',').size());
  }
  if (find_program("nvidia-smi").empty()) return 0;
  std::string out = program_output({"nvidia-smi", "-L"});
  int n = 0;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) n += line.rfind("GPU ", 0) == 0;
  return n;
}

std::vector<std::string> visible_gpu_ids(int count) {
  std::string v = env("CUDA_VISIBLE_DEVICES");
  v.erase(std::remove(v.begin(), v.end(), ' '), v.end());
  if (!v.empty()) return split_keep_empty(v, ',');
  std::vector<std::string> ids;
  for (int i = 0; i < count; ++i) ids.push_back(std::to_string(i));
  return ids;
}

std::string shell_words(const std::vector<std::string>& words) {
  static const std::regex kPlain("^[A-Za-z0-9_./:=,@%+^-]+$");
  std::string out;
  for (const auto& w : words) {
    if (!out.empty()) out += ' ';
    if (std::regex_match(w, kPlain)) {
      out += w;
      continue;
    }
    out += '\'';
    for (char c : w) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  }
  return out;
}

}  // namespace thetad::launch
