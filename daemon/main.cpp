// The `thetad` program: `run`, `validate`, `version` (and `run-jobs`, a test aid). Parses the
// command line, loads the job, starts MPI for `run`, and maps every failure to an exit code in
// one place (exit_code_for).
#include <execinfo.h>
#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "comm/bootstrap.hpp"
#include "comm/node_split.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "config/loader.hpp"
#include "daemon/plan/device_memory_estimate.hpp"
#include "daemon/plan/input_path.hpp"
#include "daemon/plan/memory_estimate.hpp"
#include "daemon/plan/outputs_apart.hpp"
#include "daemon/plan/peft_config.hpp"
#include "daemon/plan/token_files.hpp"
#include "daemon/train/stop_agreement.hpp"
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
  // thetad-launch's copy of the job's bytes it checked (run): read instead of JOB.yaml, which
  // names the job in messages, so that an edit after the check runs nothing unchecked.
  std::string checked_copy;
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
    } else if (arg == "--checked-copy") {
      a.checked_copy = value(arg);
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
  if ((a.command == "run" || a.command == "validate" || a.command == "run-jobs") && a.job_path.empty())
    throw thetad::ConfigError(a.command + ": missing " + (a.command == "run-jobs" ? "LIST" : "JOB.yaml"));
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
  thetad::config::Job job =
      a.checked_copy.empty()
          ? thetad::config::load_job(a.job_path, lo)
          : thetad::config::load_job_from_string(thetad::config::read_job_file(a.checked_copy), a.job_path, lo);
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
// run on more ranks may train more tasks, and checks those before its first step. The paths are
// `rank`'s ({rank} expanded; validate reads rank 0's, as the single-process reference does).
void check_token_files(const thetad::config::Job& job, int world, int rank, bool say) {
  if (job.data.kind != thetad::config::DataKind::Tokens && job.eval.dir.empty()) return;
  const int64_t files = thetad::daemon::check_token_inputs(thetad::daemon::with_input_paths(job, rank), world);
  if (say)
    std::cerr << "thetad: token files: " << files << " checked (the tasks a run of " << world
              << " rank(s) trains and evaluates; a run on more ranks checks the tasks it adds before it starts)\n";
}

// The adapters to continue from and the outputs kept out of the inputs (daemon/plan): exit 2
// before anything starts, for validate as for every rank of a run of `world` ranks.
void check_paths(const thetad::config::Job& job, int world) {
  thetad::daemon::check_adapter_inputs(job);
  thetad::daemon::check_outputs_apart(job, world);
}

// Stop signals and the launcher's ready word: the first thing `run` does.
void install_stop_handlers() {
  // A stop asked for during start-up (a launcher's SIGTERM after Ctrl-C or preemption) is
  // honoured at the first step, with a checkpoint and exit 4, instead of killing the rank.
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
}

// One job on this rank inside the MPI session: everything of `thetad run` after MPI's start.
int run_in_session(const Args& a, const thetad::config::Job& job, const thetad::comm::WorldInfo& world) {
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
    check_token_files(job, world.size, world.rank, false);  // a rank whose files are bad ends the job (below)
    check_paths(job, world.size);
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

int cmd_run(const Args& a) {
  install_stop_handlers();
  thetad::config::Job job = load(a, /*warn=*/false);  // before MPI: a bad job starts nothing
  thetad::comm::MpiSession session;
  const auto world = thetad::comm::world_info();
  report_faults();
  return run_in_session(a, job, world);
}

// The error of a command that failed, on stderr as one or more `thetad: error:` lines; its exit code.
int report_error(const std::exception& e, const std::string& command) {
  if (const auto* job_error = dynamic_cast<const thetad::config::JobError*>(&e)) {
    for (const auto& m : job_error->messages()) std::cerr << "thetad: error: " << m << "\n";
    std::cerr << "thetad: " << job_error->messages().size() << " error(s); nothing was started\n";
    return job_error->exit_code();
  }
  const int code = thetad::exit_code_for(e);
  std::cerr << "thetad: error: " << thetad::printable(e.what()) << "\n";
  if (code == thetad::kExitBadInput && command.empty()) std::cerr << kUsage;
  return code;
}

// `thetad run-jobs LIST`, a test aid (not in the usage text): the jobs of LIST run one after
// another in one process and one MPI session, so that a test of many small jobs starts LibTorch
// and MPI once per world instead of once per job (about 1.5 s of a 2-rank start against 0.2 s of
// a small job's run). Each line of LIST: `LOG JOB.yaml [thetad run's options]` (words split at
// blanks; `#` starts a comment line). A job's output, every rank's stdout and stderr, is
// appended to its LOG, as `mpirun ... thetad run ... >>LOG 2>&1` would write it, and then each
// rank's `thetad run-jobs: rank R of N: exit CODE`. A job that ends with a code on every rank (a
// bad job: exit 2) is followed by the next; one that fails on one rank aborts the whole list, as
// it aborts a job, and a stop signal ends it (exit 4). The list's exit code: its first job's
// that did not end 0, else 0.
struct ListedJob {
  std::string log;
  Args args;
};

std::vector<ListedJob> read_job_list(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw thetad::ConfigError(path + ": cannot read the job list");
  std::vector<ListedJob> jobs;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    std::istringstream words(line);
    std::vector<std::string> argv{"thetad", "run"};
    for (std::string w; words >> w;) argv.push_back(w);
    if (argv.size() == 2 || argv[2][0] == '#') continue;
    const std::string where = path + ":" + std::to_string(number) + ": ";
    if (argv.size() < 4) throw thetad::ConfigError(where + "expected LOG JOB.yaml [options]");
    ListedJob j;
    j.log = argv[2];
    argv.erase(argv.begin() + 2);
    std::vector<char*> ptrs;
    for (auto& w : argv) ptrs.push_back(w.data());
    try {
      j.args = parse_args(static_cast<int>(ptrs.size()), ptrs.data());
    } catch (const thetad::ConfigError& e) {
      throw thetad::ConfigError(where + e.what());
    }
    jobs.push_back(std::move(j));
  }
  return jobs;
}

// This process's stdout and stderr go to `path` (appended) while it lives, then back.
class OutputTo {
 public:
  explicit OutputTo(const std::string& path) {
    flush_all();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) throw thetad::Error(path + ": cannot open the job's log: " + std::strerror(errno));
    out_ = ::dup(STDOUT_FILENO);
    err_ = ::dup(STDERR_FILENO);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
  }
  ~OutputTo() {
    flush_all();
    ::dup2(out_, STDOUT_FILENO);
    ::dup2(err_, STDERR_FILENO);
    ::close(out_);
    ::close(err_);
  }
  OutputTo(const OutputTo&) = delete;
  OutputTo& operator=(const OutputTo&) = delete;

 private:
  static void flush_all() {
    thetad::log::flush();
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
  }
  int out_ = -1, err_ = -1;
};

int cmd_run_jobs(const Args& a) {
  const std::vector<ListedJob> jobs = read_job_list(a.job_path);  // before MPI: a bad list starts nothing
  install_stop_handlers();
  thetad::comm::MpiSession session;
  const auto world = thetad::comm::world_info();
  report_faults();
  int first_failure = thetad::kExitOk;
  for (const ListedJob& j : jobs) {
    const OutputTo output(j.log);
    int code = thetad::kExitOk;
    try {
      thetad::daemon::g_training_started.store(false);  // each job's start-up has its grace period
      code = run_in_session(j.args, load(j.args, /*warn=*/false), world);
    } catch (const std::exception& e) {
      code = report_error(e, "run");
    }
    // One write: the ranks append to the same file, line by whole line.
    const std::string said = "thetad run-jobs: rank " + std::to_string(world.rank) + " of " +
                             std::to_string(world.size) + ": exit " + std::to_string(code) + "\n";
    std::cerr.flush();
    (void)!::write(STDERR_FILENO, said.data(), said.size());
    if (first_failure == thetad::kExitOk) first_failure = code;
    if (code == thetad::kExitInterrupted) break;  // a stop ends the list
  }
  return first_failure;
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
      const int world = per_rank ? static_cast<int>(job.data.per_rank.size()) : 1;
      check_token_files(job, world, 0, true);
      check_paths(job, world);
      std::cout << thetad::config::to_yaml(job);
      return thetad::kExitOk;
    }
    if (args.command == "run") return cmd_run(args);
    if (args.command == "run-jobs") return cmd_run_jobs(args);
    throw thetad::ConfigError("unknown command '" + args.command + "'");
  } catch (const std::exception& e) {
    return report_error(e, args.command);
  }
}
