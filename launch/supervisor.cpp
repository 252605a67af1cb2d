// The launcher's run (see supervisor.hpp).
#include "launch/supervisor.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <set>

#include "common/errors.hpp"
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
int rank_file(const char* name) {
  if (std::strncmp(name, "rank-", 5) != 0) return -1;
  char* end = nullptr;
  long r = std::strtol(name + 5, &end, 10);
  if (end == name + 5 || (std::strcmp(end, ".pid") != 0 && std::strcmp(end, ".exit") != 0)) return -1;
  return int(r);
}

}  // namespace

Supervisor::Supervisor(Plan plan, Fd signals)
    : plan_(std::move(plan)),
      sfd_(std::move(signals)),
      sm_(Supervision::Config{plan_.ranks, plan_.nodes, plan_.launcher, 10,
                              env_seconds("THETAD_LAUNCH_STOP_WAIT_S", 120)}) {}

void Supervisor::log(const std::string& msg) {
  const std::string line = "thetad-launch: " + msg + "\n";
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
  if (DIR* d = ::opendir(plan_.log_dir.c_str())) {
    std::vector<std::string> stale;
    while (dirent* e = ::readdir(d))
      if (rank_file(e->d_name) >= 0) stale.push_back(plan_.log_dir + "/" + e->d_name);
    ::closedir(d);
    for (const auto& f : stale) ::unlink(f.c_str());
  }
  launch_log_.reset(::open((plan_.log_dir + "/launcher.log").c_str(),
                           O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (launch_log_)
    write_all(launch_log_.get(), "[" + local_timestamp(false) + "] thetad-launch: " +
                                     shell_words(plan_.command) + "\n");
  log("job " + plan_.job_name + ": " + std::to_string(plan_.ranks) + " rank(s) on " +
      std::to_string(plan_.nodes) + " node(s) via " + plan_.launcher + "; logs in " + plan_.log_dir);
  while (int sig = read_signal(sfd_.get())) perform(sm_.on_signal(sig, monotonic_s()));
  perform(sm_.on_ready_to_launch(monotonic_s()));

  while (!done_) {
    std::vector<pollfd> fds = {{sfd_.get(), POLLIN, 0},
                               {launcher_running_ ? launcher_.pidfd.get() : -1, POLLIN, 0},
                               {launcher_err_.get(), POLLIN, 0},
                               {listen_.get(), POLLIN, 0}};
    for (auto& w : wrappers_) fds.push_back({w->fd.get(), POLLIN, 0});
    const bool polling = sm_.wants_rank_count() || sm_.phase() == Phase::Draining ||
                         (launcher_running_ && !launcher_.pidfd);
    if (::poll(fds.data(), fds.size(), polling ? kPollMs : -1) < 0 && errno != EINTR)
      throw Error(std::string("poll: ") + std::strerror(errno));
    const double now = monotonic_s();
    if (fds[0].revents)
      while (int sig = read_signal(sfd_.get())) perform(sm_.on_signal(sig, now));
    if (fds[2].revents) read_launcher_stderr();
    if (fds[3].revents) accept_wrapper();
    for (size_t i = fds.size(); i-- > 4;)
      if (fds[i].revents) read_wrapper(i - 4);
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
  // The wrappers of this host send their lines here, each over its own connection: the merged
  // stream is cut into whole lines per rank, never interleaved mid-line.
  listen_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  const std::string name = "thetad-launch." + std::to_string(::getpid()) + "." + epoch_realtime();
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const socklen_t len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (listen_ && ::bind(listen_.get(), reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
      ::listen(listen_.get(), 1024) == 0)
    ::setenv(kLogSocketVar, name.c_str(), 1);
  else
    listen_.reset();  // the wrappers fall back to their stderr
  Fd err[2];
  make_pipe(err);
  SpawnSpec spec;
  spec.argv = plan_.command;
  spec.new_session = true;  // a terminal's Ctrl-C reaches only us; we decide what the ranks get
  spec.dup2s = {{err[1].get(), STDERR_FILENO}};
  launcher_ = spawn(spec);
  launcher_running_ = true;
  ::unsetenv(kLogSocketVar);
  launcher_err_ = std::move(err[0]);
}

// Asks every rank to checkpoint and exit: SIGUSR1 to mpirun/srun, which forward it to the
// wrappers without killing the job, and SIGTERM straight to this host's wrappers, so that they
// never depend on that forwarding alone (an mpirun that swallows SIGUSR1: stop_unforwarded).
void Supervisor::stop_ranks() {
  stop_sent_ = true;
  if (launcher_running_) pidfd_signal(launcher_.pidfd.get(), launcher_.pid, SIGUSR1);
  for (auto& w : wrappers_) pidfd_signal(w->pidfd.get(), w->pid, SIGTERM);
  for (pid_t pid : local_wrapper_pids()) ::kill(pid, SIGTERM);
}

void Supervisor::accept_wrapper() {
  for (;;) {
    Fd fd(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd) return;
    auto w = std::make_unique<Wrapper>();
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      w->pid = cred.pid;
      w->pidfd = pidfd_open(cred.pid);
    }
    w->fd = std::move(fd);
    // A wrapper that comes up after the stop was sent gets it too.
    if (stop_sent_ && w->pid > 0) pidfd_signal(w->pidfd.get(), w->pid, SIGTERM);
    wrappers_.push_back(std::move(w));
  }
}

void Supervisor::read_wrapper(size_t i) {
  Wrapper& w = *wrappers_[i];
  char buf[65536];
  ssize_t n = ::read(w.fd.get(), buf, sizeof buf);
  if (n < 0 && errno == EINTR) return;
  if (n > 0) {
    std::string lines = w.buf.feed(buf, size_t(n));
    if (w.rank < 0 && !lines.empty()) {  // the first line names the rank
      size_t nl = lines.find('\n');
      w.rank = std::atoi(lines.substr(0, nl).c_str());
      lines.erase(0, nl + 1);
    }
    emit(lines);
    return;
  }
  if (w.rank >= 0) emit(w.buf.finish());
  if (w.rank >= 0) closed_order_.push_back(w.rank);
  wrappers_.erase(wrappers_.begin() + long(i));
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
  while ((launcher_err_ || !wrappers_.empty()) && monotonic_s() < end) {
    std::vector<pollfd> fds = {{launcher_err_.get(), POLLIN, 0}};
    for (auto& w : wrappers_) fds.push_back({w->fd.get(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
    if (fds[0].revents) read_launcher_stderr();
    for (size_t i = fds.size(); i-- > 1;)
      if (fds[i].revents) read_wrapper(i - 1);
  }
}

int Supervisor::count_started_ranks() const {
  std::set<int> ranks;
  if (DIR* d = ::opendir(plan_.log_dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (int r = rank_file(e->d_name); r >= 0) ranks.insert(r);
    ::closedir(d);
  }
  for (const auto& w : wrappers_)
    if (w->rank >= 0) ranks.insert(w->rank);
  return int(ranks.size());
}

// This host's wrappers of this job still running: pid files naming this host whose process is
// a wrapper of our log dir (a pid file left by a crash may name a reused pid).
std::vector<pid_t> Supervisor::local_wrapper_pids() const {
  std::vector<pid_t> out;
  const std::string host = host_name();
  DIR* d = ::opendir(plan_.log_dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (rank_file(e->d_name) < 0 || name.size() < 4 || name.compare(name.size() - 4, 4, ".pid") != 0) continue;
    std::string text;
    if (!read_file(plan_.log_dir + "/" + name, text)) continue;
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
  ::closedir(d);
  return out;
}

int Supervisor::count_running_wrappers() const {
  std::set<pid_t> pids;
  for (pid_t p : local_wrapper_pids()) pids.insert(p);
  for (const auto& w : wrappers_)
    if (w->pid > 0) pids.insert(w->pid);
  int n = 0;
  for (pid_t p : pids) n += process_alive(p);
  return n;
}

int Supervisor::report() {
  drain_output(2.0);
  ::kill(-launcher_.pid, SIGKILL);  // ranks of this host that outlived mpirun/srun
  SummaryInput in;
  in.ranks = load_records(plan_.log_dir);
  in.closed_order = closed_order_;
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
  DIR* d = ::opendir(plan_.log_dir.c_str());
  if (!d) return;
  std::vector<std::string> files;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (rank_file(e->d_name) >= 0 && name.compare(name.size() - 4, 4, ".pid") == 0) files.push_back(name);
  }
  ::closedir(d);
  for (const auto& name : files) {
    std::string text;
    if (!read_file(plan_.log_dir + "/" + name, text)) continue;
    long pids[2] = {0, 0};
    char h[256] = {};
    if (std::sscanf(text.c_str(), "%ld %ld %255s", &pids[0], &pids[1], h) < 3 || host != h) continue;
    for (long pid : pids) {
      bool ours = false;
      for (const auto& arg : process_cmdline(pid_t(pid))) ours |= arg.find(plan_.job) != std::string::npos;
      if (ours) ::kill(pid_t(pid), SIGKILL);
    }
    ::unlink((plan_.log_dir + "/" + name).c_str());
  }
}

}  // namespace thetad::launch
