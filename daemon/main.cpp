// The `thetad` program: `run`, `validate`, `version`. Parses the command line, loads the job,
// starts MPI for `run`, and maps every failure to an exit code in one place (exit_code_for).
#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "comm/bootstrap.hpp"
#include "comm/node_split.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "config/loader.hpp"
#include "daemon/core/device_memory_estimate.hpp"
#include "daemon/core/memory_estimate.hpp"
#include "daemon/core/stop_agreement.hpp"
#include "daemon/core/token_files.hpp"
#include "daemon/train/trainer.hpp"
#include "daemon/version.hpp"

namespace {

const char* kUsage =
    "usage: thetad run JOB.yaml [--set key.path=value ...] [--no-resume] [--log-level LEVEL]\n"
    "       thetad validate JOB.yaml [--set key.path=value ...]\n"
    "       thetad version\n"
    "exit codes: 0 done, 2 bad job or input (a job that cannot fit this host's or device's memory too),\n"
    "            3 communication failure or lost peer, 4 stopped by a signal (checkpointed if\n"
    "            checkpoint.dir is set), 1 anything else (out of memory while running too)\n";

struct Args {
  std::string command;
  std::string job_path;
  std::vector<std::string> overrides;
  bool resume = true;
  std::string log_level;
};

Args parse_args(int argc, char** argv) {
  Args a;
  if (argc < 2) throw thetad::ConfigError("missing command");
  a.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const std::string& flag) -> std::string {
      if (i + 1 >= argc) throw thetad::ConfigError(flag + " needs a value");
      return argv[++i];
    };
    if (arg == "--set") {
      a.overrides.push_back(value(arg));
    } else if (arg.rfind("--set=", 0) == 0) {
      a.overrides.push_back(arg.substr(6));
    } else if (arg == "--no-resume") {
      a.resume = false;
    } else if (arg == "--log-level") {
      a.log_level = value(arg);
      if (!thetad::log::valid_level(a.log_level))
        throw thetad::ConfigError("--log-level: unknown level '" + a.log_level + "'");
    } else if (!arg.empty() && arg[0] == '-') {
      throw thetad::ConfigError("unknown option '" + arg + "'");
    } else if (a.job_path.empty()) {
      a.job_path = arg;
    } else {
      throw thetad::ConfigError("unexpected argument '" + arg + "'");
    }
  }
  if ((a.command == "run" || a.command == "validate") && a.job_path.empty())
    throw thetad::ConfigError(a.command + ": missing JOB.yaml");
  return a;
}

// The job's warnings (keys without effect) and notes (what it opts into, such as running a
// TorchScript file's code), on stderr.
void print_notes(const thetad::config::Job& job) {
  for (const auto& w : job.warnings) std::cerr << "thetad: warning: " << w << "\n";
  for (const auto& n : job.notes) std::cerr << "thetad: note: " << n << "\n";
}

// `warn`: print the job's warnings and notes; with several ranks only rank 0 does.
thetad::config::Job load(const Args& a, bool warn = true) {
  thetad::config::LoadOptions lo;
  lo.overrides = a.overrides;
  lo.cuda_build = thetad::torch_has_cuda();
  thetad::config::Job job = thetad::config::load_job(a.job_path, lo);
  if (warn) print_notes(job);
  return job;
}

// A stop is honoured at a step's end (checkpoint, exit 4). One that arrives before the step loop
// starts is honoured at the first step if start-up gets there within kStartupStopGraceS; a
// start-up stuck longer (a hung file system, a peer that never comes) ends the process then:
// nothing has been trained since the last checkpoint, so nothing is lost.
void on_signal(int sig) {
  const int before = thetad::daemon::g_stop_signal.exchange(sig);
  if (before == 0 && !thetad::daemon::g_training_started.load()) ::alarm(thetad::daemon::kStartupStopGraceS);
}

void on_startup_alarm(int) {
  if (thetad::daemon::g_training_started.load()) return;
  static const char msg[] = "thetad: stop signal received during start-up, which did not reach the first step "
                            "within the grace period; exiting without a step (nothing to checkpoint)\n";
  (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
  ::_exit(thetad::kExitInterrupted);
}

// An internal fault (a bug, never bad input) leaves the frames that led to it on stderr, where
// the launcher's rank logs keep them, then dies of the same signal (its exit status unchanged).
// Only async-signal-safe calls: write(2) and backtrace_symbols_fd.
void on_fault(int sig) {
  static const char head[] = "thetad: internal fault (signal ";
  char num[4] = {char('0' + sig / 10 % 10), char('0' + sig % 10), ')', '\n'};
  (void)!::write(STDERR_FILENO, head, sizeof head - 1);
  (void)!::write(STDERR_FILENO, num, sizeof num);
  void* frames[64];
  ::backtrace_symbols_fd(frames, ::backtrace(frames, 64), STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// After MPI's start-up, which installs handlers of its own for these signals.
void report_faults() {
  void* warm[1];
  ::backtrace(warm, 1);  // loads libgcc now: its first call allocates, unsafe inside a handler
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, on_fault);
}

// The host memory the job needs at least (its ranks on this host, lower bound), against what the
// host has available: exit 2 naming the sizes before anything is allocated. A CUDA build counts
// the resident groups as device memory (they are, where a GPU is found).
void check_memory(const thetad::config::Job& job, int local_ranks, const std::string& where) {
  using namespace thetad::daemon;
  const HostMemoryNeed need =
      host_memory_need(job, thetad::config::param_counts(job), local_ranks, thetad::torch_has_cuda());
  check_host_memory(job, need, host_memory_available(), where);
}

// validate: the device memory one rank needs at least, said on stderr where it matters (a CUDA
// build, or the test aid) and checked only against THETAD_TEST_DEVICE_MEMORY: validate needs no
// device (thetad run checks each rank's own once it has one).
void report_device_memory(const thetad::config::Job& job) {
  using namespace thetad::daemon;
  int64_t free_bytes = 0, total_bytes = 0;
  std::string where;
  const bool aid = device_memory_for_check(-1, nullptr, 1, &free_bytes, &total_bytes, &where);
  if (!aid && !thetad::torch_has_cuda()) return;
  const DeviceMemoryNeed need =
      device_memory_need(job, thetad::config::param_counts(job), first_step_groups(job, 1, 0));
  if (!need.known) return;
  if (aid) check_device_memory(job, need, free_bytes, total_bytes, where);
  std::cerr << "thetad: device memory: the job needs at least " << format_bytes(double(need.total()))
            << " per rank (counted for one rank): " << need.parts() << " (" << need.not_counted << " on top)\n";
}

// The token files of the tasks the run trains and evaluates (their ids against model.vocab, their
// masks): exit 2 before anything starts. validate counts one rank (data.per_rank: its ranks); a
// run on more ranks may train more tasks, and checks those before its first step.
void check_token_files(const thetad::config::Job& job, int world, bool say) {
  if (job.data.kind != thetad::config::DataKind::Tokens && job.eval.dir.empty()) return;
  const int64_t files = thetad::daemon::check_token_inputs(job, world);
  if (say)
    std::cerr << "thetad: token files: " << files << " checked (the tasks a run of " << world
              << " rank(s) trains and evaluates; a run on more ranks checks the tasks it adds before it starts)\n";
}

int cmd_run(const Args& a) {
  // First: a stop asked for during start-up (a launcher's SIGTERM after Ctrl-C or preemption)
  // is honoured at the first step, with a checkpoint and exit 4, instead of killing the rank.
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  std::signal(SIGUSR1, on_signal);  // `kill -USR1 <mpirun>` stops a plain mpirun job gracefully
  std::signal(SIGALRM, on_startup_alarm);
  // thetad-launch's wrapper passes a stop on only once told that these handlers are set.
  if (const char* fd = std::getenv("THETAD_READY_FD")) {
    (void)!::write(std::atoi(fd), "ready\n", 6);
    ::close(std::atoi(fd));
    ::unsetenv("THETAD_READY_FD");
  }
  thetad::config::Job job = load(a, /*warn=*/false);  // before MPI: a bad job starts nothing
  thetad::comm::MpiSession session;
  const auto world = thetad::comm::world_info();
  report_faults();
  if (world.rank == 0) print_notes(job);
  thetad::config::check_world(job, world.size);  // every rank alike: exit 2 before anything starts
  thetad::log::Options lo;
  lo.rank = world.rank;
  lo.level = a.log_level.empty() ? job.log.level : a.log_level;
  lo.file = job.log.file.empty() ? "" : thetad::config::expand_path(job.log.file, job, world.rank);
  int code = thetad::kExitOk;
  try {
    thetad::log::init(lo);
    // The launcher names a lost node's ranks from this line; tests check the split with it.
    const auto place = thetad::comm::node_place();
    THETAD_LOG(info, "comm") << "rank " << world.rank << " of " << world.size << ": node "
                             << place.node << " of " << place.nodes
                             << (place.simulated ? " (simulated)" : "") << ", node-local rank "
                             << world.local_rank << " of " << world.local_size;
    thetad::log::check_file();  // a log.file that takes no line (a full disk) stops the run now
    check_memory(job, world.local_size, "this node (" + std::to_string(world.local_size) + " rank(s))");
    check_token_files(job, world.size, false);  // a rank whose files are bad ends the job (below)
    code = thetad::daemon::run_worker(job, thetad::daemon::RunOptions{a.resume});
    thetad::log::check_file();  // the run's last lines (the final hash) too
  } catch (const std::exception& e) {
    code = thetad::exit_code_for(e);
    THETAD_LOG(error, "thetad") << e.what();
    thetad::log::flush();
    // A failure on one rank must end the whole job, never leave the others waiting.
    if (world.size > 1) thetad::comm::abort_job(code);
  }
  thetad::log::flush();
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse_args(argc, argv);
    if (args.command == "version") {
      std::cout << thetad::version_text();
      return thetad::kExitOk;
    }
    if (args.command == "help" || args.command == "--help" || args.command == "-h") {
      std::cout << kUsage;
      return thetad::kExitOk;
    }
    if (args.command == "validate") {
      thetad::config::Job job = load(args);
      check_memory(job, 1, "this host (counted for one rank)");
      report_device_memory(job);
      const bool per_rank = job.data.schedule == thetad::config::ScheduleKind::PerRank;
      check_token_files(job, per_rank ? static_cast<int>(job.data.per_rank.size()) : 1, true);
      std::cout << thetad::config::to_yaml(job);
      return thetad::kExitOk;
    }
    if (args.command == "run") return cmd_run(args);
    throw thetad::ConfigError("unknown command '" + args.command + "'");
  } catch (const thetad::config::JobError& e) {
    for (const auto& m : e.messages()) std::cerr << "thetad: error: " << m << "\n";
    std::cerr << "thetad: " << e.messages().size() << " error(s); nothing was started\n";
    return e.exit_code();
  } catch (const std::exception& e) {
    const int code = thetad::exit_code_for(e);
    std::cerr << "thetad: error: " << thetad::printable(e.what()) << "\n";
    if (code == thetad::kExitBadInput && args.command.empty()) std::cerr << kUsage;
    return code;
  }
}
