// Parsing of the launcher's command line (see options.hpp); the usage text lives here.
#include "launch/options.hpp"

#include <cstring>

#include "common/errors.hpp"
#include "common/log.hpp"

namespace thetad::launch {

const char* usage_text() {
  return R"EOF(usage: thetad-launch [options] [--] JOB.yaml [thetad run options]

Options:
  --nproc-per-node N   ranks per node (default: visible GPUs, or 2 without GPUs;
                       with a hostfile whose lines have slots=K, K)
  --hostfile F         run on the hosts of an Open MPI hostfile
  --hosts h1:n,h2:n    run on these hosts, n ranks each (n defaults to --nproc-per-node)
  --thetad PATH        the thetad binary (default: $THETAD_BIN, ../daemon/thetad from this
                       program (build tree), thetad beside it (installed), or thetad on PATH)
  --log-dir DIR        per-rank logs and exit codes (default: runs/<job>/logs)
  --launcher L         auto (default: srun inside a Slurm allocation, else mpirun) | mpirun | srun
  --simulate-nodes N   testing aid: N nodes on this one host, --nproc-per-node ranks each
                       (sets THETAD_SIMULATE_NODES=N: per-node arenas, owners, devices, logs)
  --dry-run            print the commands instead of running them
  -h, --help           this help

thetad run options after JOB.yaml (--set k=v, --no-resume, --log-level L) go to every rank;
the --set options also apply when the launcher checks the job.

Environment: THETAD_MPIRUN (mpirun to use), THETAD_MPIRUN_ARGS (replaces the network
flags), THETAD_MPIRUN_BIND (replaces the binding flags), THETAD_SRUN_ARGS (extra srun flags),
THETAD_LAUNCH_STOP_WAIT_S (120: how long a stop waits for ranks that outlive srun).
NCCL_*, THETAD_*, CUDA_VISIBLE_DEVICES and OMP_NUM_THREADS reach every rank.

Signals: SIGINT, SIGTERM or SIGHUP at any time: every rank checkpoints and exits 4 (further
ones while stopping are ignored); SIGQUIT kills the job.

Exit codes: 0 done, 2 bad job or usage, 3 communication failure or lost rank,
4 interrupted and checkpointed, 1 anything else.
)EOF";
}

namespace {

// "--flag VALUE" or "--flag=VALUE": true when argv[i] is `flag`, with the value stored.
bool take(const char* flag, int argc, char** argv, int& i, std::string& out) {
  const size_t n = std::strlen(flag);
  const char* a = argv[i];
  if (std::strcmp(a, flag) == 0) {
    if (i + 1 >= argc) throw ConfigError(std::string(flag) + " needs a value (see --help)");
    out = argv[++i];
    return true;
  }
  if (std::strncmp(a, flag, n) == 0 && a[n] == '=') {
    out = a + n + 1;
    return true;
  }
  return false;
}

// The --set overrides (also for the in-process check) and a --log-level typo caught before
// anything starts (thetad's own level names: common/log.hpp).
void scan_run_args(Options& o) {
  const auto& r = o.run_args;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r[i] == "--set") {
      if (i + 1 >= r.size()) throw ConfigError("--set needs key=value");
      o.overrides.push_back(r[++i]);
    } else if (r[i].rfind("--set=", 0) == 0) {
      o.overrides.push_back(r[i].substr(6));
    } else if (r[i] == "--log-level") {
      if (i + 1 >= r.size()) throw ConfigError("--log-level needs a level");
      if (!log::valid_level(r[i + 1]))
        throw ConfigError("--log-level: unknown level '" + r[i + 1] +
                          "' (expected trace, debug, info, warn, error, critical or off)");
      ++i;
    } else if (r[i].rfind("--log-level=", 0) == 0) {
      throw ConfigError("write --log-level LEVEL (thetad run takes no '--log-level=')");
    }
  }
}

}  // namespace

Options parse_options(int argc, char** argv) {
  Options o;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (take("--nproc-per-node", argc, argv, i, o.nproc) || take("--hostfile", argc, argv, i, o.hostfile) ||
        take("--hosts", argc, argv, i, o.hosts) || take("--thetad", argc, argv, i, o.thetad) ||
        take("--log-dir", argc, argv, i, o.log_dir) || take("--launcher", argc, argv, i, o.launcher) ||
        take("--simulate-nodes", argc, argv, i, o.simulate_nodes))
      continue;
    if (a == "--dry-run") {
      o.dry_run = true;
    } else if (a == "-h" || a == "--help") {
      o.help = true;
      return o;
    } else if (a == "--") {
      ++i;
      break;
    } else if (!a.empty() && a[0] == '-') {
      throw ConfigError("unknown option " + a + " (see --help)");
    } else {
      break;
    }
  }
  if (i >= argc) throw ConfigError("");  // no JOB.yaml: the usage goes to stderr
  o.job = argv[i++];
  for (; i < argc; ++i) o.run_args.push_back(argv[i]);
  scan_run_args(o);
  return o;
}

}  // namespace thetad::launch
