// The launcher's run (see supervisor.hpp).
#include "launch/supervisor.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include "common/errors.hpp"
#include "common/text.hpp"
#include "launch/private_dir.hpp"
#include "launch/summary.hpp"
#include "launch/worker.hpp"

namespace thetad::launch {

namespace {

constexpr int kPollMs = 100;  // rank-count and drain polling while a stop waits on them

double env_seconds(const char* key, double dflt) {
  const char* v = std::getenv(key);
  return v && *v ? std::atof(v) : dflt;
}

// "rank-R.pid" / "rank-R.exit" -> R, else -1.
int rank_file(const std::string& name) { return std::max(rank_of(name, "pid"), rank_of(name, "exit")); }

// The files the launcher and its wrappers write in the log dir.
bool launcher_file(const std::string& name) {
  const bool node_log = name.rfind("node-", 0) == 0 && name.size() > 9 && name.compare(name.size() - 4, 4, ".log") == 0;
  return name == "launcher.log" || node_log || rank_file(name) >= 0 || rank_of(name, "log") >= 0;
}

}  // namespace

Supervisor::Supervisor(Plan plan, Fd signals)
    : plan_(std::move(plan)),
      sfd_(std::move(signals)),
      sm_(Supervision::Config{plan_.ranks, plan_.nodes, plan_.launcher, 10,
                              env_seconds("THETAD_LAUNCH_STOP_WAIT_S", 120)}),
      links_(plan_.ranks, [this](const std::string& lines) { emit(lines); },
             [this](const std::string& msg) { log(msg); }) {}

void Supervisor::log(const std::string& msg) {
  const std::string line = "thetad-launch: " + printable(msg) + "\n";
  write_all(STDERR_FILENO, line);
}

// Everything that reaches the terminal and launcher.log from elsewhere (ranks, mpirun) has its
// control bytes written out: no rank's output can move the cursor, retitle or clear the screen.
void Supervisor::emit(const std::string& lines) {
  if (lines.empty()) return;
  const std::string safe = escape_controls(lines);
  write_all(STDERR_FILENO, safe);
  if (launch_log_) write_all(launch_log_.get(), safe);
}

int Supervisor::run() {
  const double t0 = monotonic_s();
  while (int sig = read_signal(sfd_.get())) perform(sm_.on_signal(sig, t0));  // while checking
  // Before anything starts: the log dir is this user's own, and none of the files the launcher
  // and its wrappers write there is a link, a FIFO or another user's (exit 2).
  dir_ = open_private_dir(plan_.log_dir, false, "log dir");
  for (const auto& name : list_dir(dir_.get())) {
    if (!launcher_file(name)) continue;
    const std::string why = unsafe_entry(dir_.get(), name);
    if (!why.empty()) throw ConfigError("log file '" + plan_.log_dir + "/" + name + "' " + why + ": not written (remove it)");
    if (rank_file(name) >= 0) ::unlinkat(dir_.get(), name.c_str(), 0);  // a former run's records
  }
  std::string why;
  launch_log_ = open_append_at(dir_.get(), "launcher.log", why);
  if (!launch_log_) throw ConfigError("log file '" + plan_.log_dir + "/launcher.log' " + why + ": not written");
  write_all(launch_log_.get(), "[" + local_timestamp(false) + "] thetad-launch: " + shell_words(plan_.command) + "\n");
  log("job " + plan_.job_name + ": " + std::to_string(plan_.ranks) + " rank(s) on " +
      std::to_string(plan_.nodes) + " node(s) via " + plan_.launcher + "; logs in " + plan_.log_dir);
  while (int sig = read_signal(sfd_.get())) perform(sm_.on_signal(sig, monotonic_s()));
  perform(sm_.on_ready_to_launch(monotonic_s()));

  while (!done_) {
    std::vector<pollfd> fds = {{sfd_.get(), POLLIN, 0},
                               {launcher_running_ ? launcher_.pidfd.get() : -1, POLLIN, 0},
                               {launcher_err_.get(), POLLIN, 0}};
    links_.add_poll_fds(fds);
    const bool polling = sm_.wants_rank_count() || sm_.phase() == Phase::Draining ||
                         (launcher_running_ && !launcher_.pidfd);
    int timeout = links_.next_deadline_ms(monotonic_s());
    if (polling && (timeout < 0 || timeout > kPollMs)) timeout = kPollMs;
    if (::poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR)
      throw Error(std::string("poll: ") + std::strerror(errno));
    const double now = monotonic_s();
    if (fds[0].revents)
      while (int sig = read_signal(sfd_.get())) perform(sm_.on_signal(sig, now));
    if (fds[2].revents) read_launcher_stderr();
    links_.handle(fds, 3, now);
    links_.expire(now);
    int code = 0;
    if (!done_ && launcher_running_ && reap(launcher_.pid, code)) {
      launcher_running_ = false;
      perform(sm_.on_launcher_exit(code, monotonic_s()));
    }
    if (!done_ && sm_.wants_rank_count()) perform(sm_.on_ranks_started(count_started_ranks(), monotonic_s()));
    if (!done_ && sm_.phase() == Phase::Draining)
      perform(sm_.on_local_ranks(count_running_wrappers(), monotonic_s()));
  }
  if (summarize_) exit_code_ = report();
  cleanup();
  return exit_code_;
}

void Supervisor::perform(const Actions& actions) {
  for (const auto& a : actions) {
    switch (a.kind) {
      case Action::Log: log(a.text); break;
      case Action::Launch: launch(); break;
      case Action::StopRanks: stop_ranks(); break;
      case Action::Exit: done_ = true; exit_code_ = a.code; break;
      case Action::Summarize: done_ = true; summarize_ = true; exit_code_ = a.code; break;
    }
  }
}

void Supervisor::launch() {
  // The wrappers of this host send their lines to the launcher, each over its own connection:
  // the merged stream is cut into whole lines per rank, never interleaved mid-line.
  links_.open();
  Fd err[2];
  make_pipe(err);
  SpawnSpec spec;
  spec.argv = plan_.command;
  spec.new_session = true;  // a terminal's Ctrl-C reaches only us; we decide what the ranks get
  spec.dup2s = {{err[1].get(), STDERR_FILENO}};
  launcher_ = spawn(spec);
  launcher_running_ = true;
  links_.hide();
  launcher_err_ = std::move(err[0]);
}

// Asks every rank to checkpoint and exit: SIGUSR1 to mpirun/srun, which forward it to the
// wrappers without killing the job, and SIGTERM straight to this host's wrappers, so that they
// never depend on that forwarding alone (an mpirun that swallows SIGUSR1: stop_unforwarded).
void Supervisor::stop_ranks() {
  if (launcher_running_) pidfd_signal(launcher_.pidfd.get(), launcher_.pid, SIGUSR1);
  links_.stop_all();
  for (pid_t pid : local_wrapper_pids()) ::kill(pid, SIGTERM);
}

void Supervisor::read_launcher_stderr() {
  char buf[65536];
  ssize_t n = ::read(launcher_err_.get(), buf, sizeof buf);
  if (n < 0 && errno == EINTR) return;
  if (n > 0) return emit(launcher_buf_.feed(buf, size_t(n)));
  emit(launcher_buf_.finish());
  launcher_err_.reset();
}

// After mpirun/srun ended: the lines still in flight, for at most `limit_s`.
void Supervisor::drain_output(double limit_s) {
  const double end = monotonic_s() + limit_s;
  while ((launcher_err_ || links_.proven() > 0) && monotonic_s() < end) {
    std::vector<pollfd> fds = {{launcher_err_.get(), POLLIN, 0}};
    links_.add_poll_fds(fds);
    if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
    if (fds[0].revents) read_launcher_stderr();
    links_.handle(fds, 1, monotonic_s());
  }
}

int Supervisor::count_started_ranks() const {
  std::set<int> ranks;
  for (const auto& name : list_dir(dir_.get()))
    if (int r = rank_file(name); r >= 0) ranks.insert(r);
  for (int r : links_.ranks()) ranks.insert(r);
  return int(ranks.size());
}

// This host's wrappers of this job still running: pid files naming this host whose process is
// a wrapper of our log dir (a pid file left by a crash may name a reused pid).
std::vector<pid_t> Supervisor::local_wrapper_pids() const {
  std::vector<pid_t> out;
  const std::string host = host_name();
  for (const auto& name : list_dir(dir_.get())) {
    std::string text;
    if (rank_of(name, "pid") < 0 || !read_file_at(dir_.get(), name, text)) continue;
    long wrapper = 0, child = 0;
    char h[256] = {};
    if (std::sscanf(text.c_str(), "%ld %ld %255s", &wrapper, &child, h) < 3 || host != h) continue;
    bool worker = false, ours = false;
    for (const auto& arg : process_cmdline(pid_t(wrapper))) {
      worker |= arg == "--worker";
      ours |= arg == plan_.log_dir;
    }
    if (worker && ours) out.push_back(pid_t(wrapper));
  }
  return out;
}

int Supervisor::count_running_wrappers() const {
  std::set<pid_t> pids;
  for (pid_t p : local_wrapper_pids()) pids.insert(p);
  for (pid_t p : links_.pids()) pids.insert(p);
  int n = 0;
  for (pid_t p : pids) n += process_alive(p);
  return n;
}

int Supervisor::report() {
  drain_output(2.0);
  ::kill(-launcher_.pid, SIGKILL);  // ranks of this host that outlived mpirun/srun
  SummaryInput in;
  in.ranks = load_records(dir_.get());
  in.closed_order = links_.closed_order();
  in.ranks_total = plan_.ranks;
  in.nodes = plan_.nodes;
  in.host_list = plan_.host_list;
  in.simulated = plan_.simulated;
  in.launcher = plan_.launcher;
  in.launcher_code = sm_.launcher_code();
  in.stopped = sm_.stop_requested();
  in.log_dir = plan_.log_dir;
  Verdict v = summarize(in);
  for (const auto& line : v.lines) log(line);
  return v.code;
}

// Kills whatever is left: mpirun/srun's session (TERM, then KILL after 2 s), then this host's
// ranks recorded in pid files.
void Supervisor::cleanup() {
  if (launcher_running_) {
    ::kill(-launcher_.pid, SIGTERM);
    pollfd p{launcher_.pidfd.get(), POLLIN, 0};
    int code;
    for (int i = 0; i < 20 && !reap(launcher_.pid, code); ++i) ::poll(&p, 1, 100);
    ::kill(-launcher_.pid, SIGKILL);
    ::kill(launcher_.pid, SIGKILL);
    reap(launcher_.pid, code);
  }
  const std::string host = host_name();
  if (!dir_) return;
  for (const auto& name : list_dir(dir_.get())) {
    std::string text;
    if (rank_of(name, "pid") < 0 || !read_file_at(dir_.get(), name, text)) continue;
    long pids[2] = {0, 0};
    char h[256] = {};
    if (std::sscanf(text.c_str(), "%ld %ld %255s", &pids[0], &pids[1], h) < 3 || host != h) continue;
    for (long pid : pids) {
      bool ours = false;
      for (const auto& arg : process_cmdline(pid_t(pid))) ours |= arg.find(plan_.job) != std::string::npos;
      if (ours) ::kill(pid_t(pid), SIGKILL);
    }
    ::unlinkat(dir_.get(), name.c_str(), 0);
  }
}

}  // namespace thetad::launch
