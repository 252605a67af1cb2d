// The per-rank wrapper (see worker.hpp): one poll loop over its signalfd, thetad's pidfd, its
// stderr pipe and its readiness pipe. Stop signals only set state; the loop acts on it.
#include "launch/worker.hpp"

#include <poll.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/errors.hpp"
#include "launch/log_socket.hpp"
#include "launch/plan.hpp"
#include "launch/private_dir.hpp"
#include "launch/spawn.hpp"
#include "launch/worker_io.hpp"

extern char** environ;

namespace thetad::launch {

namespace {

// Without its stop handler thetad dies of SIGTERM instead of checkpointing, so the stop waits
// for the readiness report; a thetad that never reports gets it after this long anyway.
constexpr double kReadyWaitS = 300;
// After thetad ended, how long its stderr may stay open (a leftover child of it).
constexpr double kDrainS = 5;

int env_int(const char* a, const char* b, const char* c, int dflt) {
  for (const char* k : {a, b, c})
    if (const char* v = k ? std::getenv(k) : nullptr; v && *v) return std::atoi(v);
  return dflt;
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// The node rank `rank` runs on, as the logs name it: under THETAD_SIMULATE_NODES the index of its
// block of contiguous ranks (the blocks comm/node_split.cpp cuts), else the host's name.
std::string node_label(int rank, int& sim_nodes) {
  const int size = env_int("OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", nullptr, 1);
  const char* n = std::getenv("THETAD_SIMULATE_NODES");
  sim_nodes = n && n[0] >= '1' && n[0] <= '9' && all_digits(n) ? std::atoi(n) : 0;
  if (sim_nodes > 0 && size % sim_nodes == 0) return std::to_string(rank / (size / sim_nodes));
  sim_nodes = 0;
  std::string host = host_name();  // a file name part: node-HOST.log
  for (char& c : host)
    if (c == '/' || c == ' ') c = '_';
  return host;
}

// `name` in the log dir, opened to append; a planted link, FIFO or another user's file is exit 2
// before thetad starts.
Fd open_log(int dir, const std::string& dir_path, const std::string& name) {
  std::string why;
  Fd fd = open_append_at(dir, name, why);
  if (!fd) throw ConfigError("log file '" + dir_path + "/" + name + "' " + why + ": not written (remove it)");
  return fd;
}

// A simulated node sees only its share of this host's GPUs, as a real node sees its own.
void narrow_gpus_to_node(int node, int sim_nodes) {
  const int ngpu = count_gpus();
  const int per = ngpu / sim_nodes;
  if (per <= 0) return;
  const auto ids = visible_gpu_ids(ngpu);
  std::string mine;
  for (int i = node * per; i < node * per + per && i < int(ids.size()); ++i)
    mine += (mine.empty() ? "" : ",") + ids[size_t(i)];
  ::setenv("CUDA_VISIBLE_DEVICES", mine.c_str(), 1);
}

struct WorkerState {
  pid_t child = -1;
  bool stop = false;       // a stop signal came
  double stop_at = 0;
  bool ready = false;      // thetad reported its stop handler installed
  bool forwarded = false;  // thetad got its one SIGTERM
  bool exited = false;
  int code = 0;

  void forward_if_due(double now) {
    if (!stop || forwarded || exited) return;
    if (!ready && now - stop_at < kReadyWaitS) return;
    forwarded = true;
    ::kill(child, SIGTERM);
    ::kill(child, SIGCONT);  // a stopped thetad must run to checkpoint
  }
};

}  // namespace

int exec_child_main(int argc, char** argv) {
  if (argc < 5 || std::strcmp(argv[3], "--") != 0) return 2;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != pid_t(std::atol(argv[2]))) return 137;  // the wrapper is gone already
  // Started with SIGUSR1 blocked (a forwarded one waits), now ignored: a pending one is dropped.
  std::signal(SIGUSR1, SIG_IGN);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execvp(argv[4], argv + 4);
  std::fprintf(stderr, "thetad-launch: cannot run '%s': %s\n", argv[4], std::strerror(errno));
  return errno == ENOENT ? 127 : 126;
}

int worker_main(int argc, char** argv) {
  // From the first moment a stop is kept (blocked, read from the signalfd), never lost. The
  // wrapper's parent (mpirun, slurmstepd) gone stops the rank too: PR_SET_PDEATHSIG sends a
  // signal of its own, taken as a stop only when the parent process is really gone (the kernel
  // sends it also when just the thread that started us ends).
  const int parent_gone = SIGRTMIN;
  Fd sfd = take_signals({SIGTERM, SIGINT, SIGUSR1, SIGHUP, SIGCHLD, parent_gone}, false);
  const pid_t parent = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, parent_gone);
  if (::getppid() != parent) ::raise(parent_gone);
  if (argc < 3) throw ConfigError("--worker needs LOGDIR");
  const std::string logdir = argv[2];
  int first = 3;
  if (first < argc && std::strcmp(argv[first], "--") == 0) ++first;
  if (first >= argc) throw ConfigError("--worker needs a command");
  std::vector<std::string> cmd(argv + first, argv + argc);

  const int rank = env_int("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", 0);
  int sim_nodes = 0;
  const std::string node = node_label(rank, sim_nodes);
  if (sim_nodes > 0) narrow_gpus_to_node(std::atoi(node.c_str()), sim_nodes);
  // The launcher checked the log dir; it is checked again here, where the files are written
  // (another host, or a dir replaced since), and every file is opened relative to it.
  const Fd dir = open_private_dir(logdir, true, "log dir");
  const std::string base = "rank-" + std::to_string(rank);
  const std::string exit_file = base + ".exit", pid_file = base + ".pid";
  ::unlinkat(dir.get(), exit_file.c_str(), 0);
  std::string words;
  for (const auto& w : cmd) words += (words.empty() ? "" : " ") + w;
  const std::string header = "[" + local_timestamp(true) + "] [rank " + std::to_string(rank) +
                             "] [launch] info: host " + host_name() + " node " + node + " pid " +
                             std::to_string(::getpid()) + " starts: " + words + "\n";
  RankOutput out(rank, open_log(dir.get(), logdir, base + ".log"), open_log(dir.get(), logdir, "node-" + node + ".log"));
  out.write_files(header);
  out.connect_launcher();

  Fd err[2], ready[2];
  make_pipe(err);
  make_pipe(ready);
  SpawnSpec spec;
  spec.argv = {self_exe(), "--exec-child", std::to_string(::getpid()), "--"};
  spec.argv.insert(spec.argv.end(), cmd.begin(), cmd.end());
  // thetad gets neither the readiness fd of this wrapper's parent nor the log socket's path and
  // token (a job that prints its environment must not show them).
  const auto named = [](const char* entry, const char* var) {
    const size_t n = std::strlen(var);
    return std::strncmp(entry, var, n) == 0 && entry[n] == '=';
  };
  for (char** e = environ; *e; ++e)
    if (!named(*e, kReadyFdVar) && !named(*e, kLogSocketVar) && !named(*e, kLogTokenVar)) spec.env.push_back(*e);
  spec.env.push_back(std::string(kReadyFdVar) + "=3");
  spec.dup2s = {{err[1].get(), STDERR_FILENO}, {ready[1].get(), 3}};
  spec.blocked = {SIGUSR1};
  WorkerState st;
  Child child = spawn(spec);
  st.child = child.pid;
  err[1].reset();
  ready[1].reset();
  // The host too: with a log dir shared across hosts, the launcher stops only its own host's.
  replace_file_at(dir.get(), pid_file,
                  std::to_string(::getpid()) + " " + std::to_string(child.pid) + " " + host_name() + " " + node + "\n");

  double drain_until = 0;
  char buf[65536];
  while (err[0] || !st.exited) {
    const double now = monotonic_s();
    if (st.exited && now >= drain_until) break;
    pollfd fds[4] = {{sfd.get(), POLLIN, 0}, {err[0].get(), POLLIN, 0},
                     {ready[0].get(), POLLIN, 0}, {child.pidfd.get(), POLLIN, 0}};
    int timeout = st.exited ? int((drain_until - now) * 1000) + 1 : -1;
    if (st.stop && !st.ready && !st.forwarded) timeout = 1000;
    if (::poll(fds, 4, timeout) < 0 && errno != EINTR) break;
    if (fds[0].revents)
      while (int sig = read_signal(sfd.get()))
        if (sig != SIGCHLD && !st.stop && (sig != parent_gone || ::getppid() != parent)) {
          st.stop = true;
          st.stop_at = monotonic_s();
        }
    if (fds[2].revents) {
      ssize_t n = ::read(ready[0].get(), buf, sizeof buf);
      if (n > 0) st.ready = true;
      if (n == 0 || (n < 0 && errno != EINTR)) ready[0].reset();
    }
    if (fds[1].revents) {
      ssize_t n = ::read(err[0].get(), buf, sizeof buf);
      if (n > 0) out.feed(buf, size_t(n));
      if (n == 0 || (n < 0 && errno != EINTR)) err[0].reset();
    }
    if (!st.exited && reap(st.child, st.code)) {
      st.exited = true;
      drain_until = monotonic_s() + kDrainS;
    }
    st.forward_if_due(monotonic_s());
  }
  out.finish();
  // Exit code and time: the launcher names the first failing rank by this time.
  replace_file_at(dir.get(), exit_file, std::to_string(st.code) + " " + epoch_realtime() + " " + node + "\n");
  ::unlinkat(dir.get(), pid_file.c_str(), 0);
  return st.code;
}

}  // namespace thetad::launch
