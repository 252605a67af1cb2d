// JSON-lines metrics writer (step and evaluation records, the job beside them, an earlier run's
// file moved aside) and the JSON text helpers (escaping, finite numbers).
#include "daemon/observe/metrics.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "common/errors.hpp"
#include "common/safe_file.hpp"
#include "common/log.hpp"

namespace thetad::daemon {

void append_json_number(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  // %.17g round-trips any double; trailing noise such as 0.10000000000000001 is the price.
  // Metrics are read by programs, so exactness wins over looks.
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  out += buf;
}

void append_json_number(std::string& out, int64_t v) { out += std::to_string(v); }

std::string utc_time_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  std::tm utc{};
  gmtime_r(&ts.tv_sec, &utc);
  char buf[40];
  const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(buf + n, sizeof buf - n, ".%03ldZ", ts.tv_nsec / 1000000);
  return buf;
}

namespace {

template <typename T>
void field(std::string& out, const char* key, T v) {
  out += '"';
  out += key;
  out += "\":";
  append_json_number(out, v);
  out += ',';
}

void text_field(std::string& out, const char* key, const std::string& v) {
  out += '"';
  out += key;
  out += "\":";
  append_json_string(out, v);
  out += ',';
}

// [{"task":t,"<name>":v},...]
void task_list(std::string& out, const char* key, const char* name, const std::vector<TaskLoss>& v) {
  out += '"';
  out += key;
  out += "\":[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ',';
    out += "{\"task\":";
    append_json_number(out, static_cast<int64_t>(v[i].task));
    out += ",\"";
    out += name;
    out += "\":";
    append_json_number(out, v[i].loss);
    out += '}';
  }
  out += "],";
}

}  // namespace

std::string to_json(const StepRecord& r) {
  std::string out;
  out.reserve(512 + 40 * r.task_loss.size());
  out += '{';
  field(out, "step", r.step);
  field(out, "rank", static_cast<int64_t>(r.rank));
  text_field(out, "kind", "train");
  text_field(out, "time", r.time);
  field(out, "loss", r.loss);
  task_list(out, "task_loss", "loss", r.task_loss);
  field(out, "lr", r.lr);
  field(out, "samples", r.samples);
  field(out, "step_ms", r.step_ms);
  field(out, "forward_ms", r.forward_ms);
  field(out, "backward_ms", r.backward_ms);
  field(out, "comm_wait_ms", r.comm_wait_ms);
  field(out, "optimizer_ms", r.optimizer_ms);
  field(out, "count_exchange_ms", r.count_exchange_ms);
  field(out, "bytes_allreduced", r.bytes_allreduced);
  field(out, "bytes_pruned", r.bytes_pruned);
  field(out, "buckets_launched", r.buckets_launched);
  field(out, "buckets_pruned", r.buckets_pruned);
  field(out, "buckets_broadcast", r.buckets_broadcast);
  field(out, "buckets_kept", r.buckets_kept);
  field(out, "bytes_kept", r.bytes_kept);
  field(out, "bytes_state_moved", r.bytes_state_moved);
  field(out, "state_moves", r.state_moves);
  field(out, "allreduce_algbw_gbs", r.allreduce_algbw_gbs);
  field(out, "allreduce_busbw_gbs", r.allreduce_busbw_gbs);
  field(out, "broadcast_algbw_gbs", r.broadcast_algbw_gbs);
  field(out, "comm_busy_ms", r.comm_busy_ms);
  field(out, "grad_stream_peak_bytes", r.grad_stream_peak_bytes);
  field(out, "h2d_bytes", r.store.h2d_bytes);
  field(out, "d2h_bytes", r.store.d2h_bytes);
  field(out, "swap_hits", r.store.swap_hits);
  field(out, "swap_misses", r.store.swap_misses);
  field(out, "device_mem_peak_bytes", r.device_mem_peak_bytes);
  field(out, "host_pinned_bytes", r.store.host_pinned_bytes);
  field(out, "cpu_adam_ms", r.store.cpu_adam_ms);
  field(out, "acquire_wait_ms", r.store.acquire_wait_ms);
  field(out, "cache_loads", r.store.cache_loads);
  field(out, "cache_flushes", r.store.cache_flushes);
  field(out, "device_steps", r.store.device_steps);
  field(out, "streamed_steps", r.store.streamed_steps);
  field(out, "act_offload_bytes", r.act_offload_bytes);
  field(out, "act_device_peak_bytes", r.act_device_peak_bytes);
  field(out, "act_layer_bytes", r.act_layer_bytes);
  field(out, "act_pool_allocations", r.act_pool_allocations);
  field(out, "theta_h2d_bytes", r.theta.h2d_bytes);
  field(out, "theta_d2h_bytes", r.theta.d2h_bytes);
  field(out, "theta_device_slot_bytes", r.theta_device_slot_bytes);
  field(out, "theta_device_steps", r.theta.device_steps);
  field(out, "theta_cpu_adam_ms", r.theta.cpu_adam_ms);
  field(out, "mem_params_bytes", r.mem_params_bytes);
  field(out, "mem_grads_bytes", r.mem_grads_bytes);
  field(out, "mem_optimizer_bytes", r.mem_optimizer_bytes);
  field(out, "mem_lines_bytes", r.mem_lines_bytes);
  field(out, "mem_activations_bytes", r.mem_activations_bytes);
  field(out, "mem_other_bytes", r.mem_other_bytes);
  field(out, "mem_step_peak_bytes", r.mem_step_peak_bytes);
  field(out, "nonfinite", r.nonfinite);
  field(out, "skipped", r.skipped);
  field(out, "samples_per_s", r.samples_per_s);
  field(out, "tokens_per_s", r.tokens_per_s);
  field(out, "grad_norm", r.grad_norm);
  task_list(out, "grad_norm_task", "norm", r.grad_norm_task);
  out.back() = '}';  // replaces the last field's ','
  return out;
}

std::string to_json(const EvalRecord& r) {
  std::string out;
  out.reserve(128 + 48 * r.eval_loss.size());
  out += '{';
  field(out, "step", r.step);
  text_field(out, "kind", "eval");
  text_field(out, "time", r.time);
  // Objects keyed by the task id (JSON keys are strings).
  for (const char* key : {"eval_loss", "eval_tokens"}) {
    out += '"';
    out += key;
    out += "\":{";
    for (size_t i = 0; i < r.eval_loss.size(); ++i) {
      if (i) out += ',';
      append_json_string(out, std::to_string(r.eval_loss[i].task));
      out += ':';
      if (key[5] == 'l') append_json_number(out, r.eval_loss[i].loss);
      else append_json_number(out, i < r.eval_tokens.size() ? r.eval_tokens[i] : int64_t{0});
    }
    out += "},";
  }
  field(out, "eval_ms", r.eval_ms);
  out.back() = '}';
  return out;
}

int64_t step_of_record(const std::string& line, bool* eval) {
  static const std::string kHead = "{\"step\":";
  static const std::string kEval = "\"kind\":\"eval\"";
  if (line.compare(0, kHead.size(), kHead) != 0 || line.back() != '}') return -1;
  int64_t step = 0;
  size_t i = kHead.size();
  if (i >= line.size() || !std::isdigit(static_cast<unsigned char>(line[i]))) return -1;
  for (; i < line.size() && std::isdigit(static_cast<unsigned char>(line[i])) && step < (int64_t{1} << 58); ++i)
    step = step * 10 + (line[i] - '0');
  if (i >= line.size() || line[i] != ',') return -1;
  if (eval) *eval = line.compare(i + 1, kEval.size(), kEval) == 0;
  return step;
}

namespace {

// A resumed run's metrics file: the step records before `resume_step` and the evaluations up to it
// (an evaluation after s steps precedes the checkpoint of step s), rewritten in place (through a
// temporary file renamed over it, so a crash here loses nothing).
void keep_records_before(const std::string& path, int64_t resume_step) {
  std::ifstream in(path);
  if (!in) return;  // nothing written yet
  std::string kept, line;
  size_t dropped = 0, invalid = 0, first_invalid = 0, number = 0;
  while (std::getline(in, line)) {
    ++number;
    bool eval = false;
    const int64_t s = line.empty() ? -1 : step_of_record(line, &eval);
    if (s >= 0 && (eval ? s <= resume_step : s < resume_step)) kept += line + "\n";
    else ++dropped;
    if (s < 0 && !line.empty() && invalid++ == 0) first_invalid = number;
  }
  if (dropped == 0) return;
  // Lines that are no step record (a torn last line after a crash, text added by hand) go too:
  // said, never silently.
  if (invalid > 0) {
    THETAD_LOG(warn, "metrics") << path << ": " << invalid << " line(s) that are not records (the first at line "
                                << first_invalid << ") dropped with the records of the replayed steps";
  }
  const std::string tmp = path + ".resume-tmp";
  const int fd = safe_file::create_fresh(tmp);
  const bool ok = fd >= 0 && ::write(fd, kept.data(), kept.size()) == static_cast<ssize_t>(kept.size());
  const int err = errno;
  if (fd >= 0 && ::close(fd) != 0 && ok) errno = err;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = ok ? errno : err;
    if (fd >= 0) ::unlink(tmp.c_str());
    throw ConfigError(path + ": cannot drop the records of the steps replayed after the resume: " + std::strerror(e));
  }
}

// `path`.lock, locked for this job (a sidecar: the metrics file itself is replaced by rename on
// resume, which would drop a lock held on it). Returns its descriptor.
int lock_metrics(const std::string& path) {
  const std::string lock = path + ".lock";
  std::string why;
  const int fd = safe_file::open_own(lock, O_RDWR, 0644, &why);
  if (fd < 0) throw ConfigError(lock + ": metrics.path: cannot create the metrics file's lock: " + why);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder(256, '\0');
    const ssize_t n = ::pread(fd, holder.data(), holder.size(), 0);
    holder.resize(n > 0 ? static_cast<size_t>(n) : 0);
    ::close(fd);
    if (err == EWOULDBLOCK)
      throw ConfigError(path + ": metrics.path is in use by another job (" + (holder.empty() ? "holder unknown" : holder) +
                        "); two jobs on one metrics file would truncate or interleave each other's records (give "
                        "each job its own metrics.path)");
    throw ConfigError(lock + ": cannot lock the metrics file: " + std::strerror(err));
  }
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::string who = "pid " + std::to_string(::getpid()) + " on " + host;
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, who.data(), who.size(), 0) < 0) {
    const int err = errno;
    ::close(fd);
    throw ConfigError(lock + ": cannot write the metrics file's lock: " + std::strerror(err));
  }
  return fd;
}

// A fresh run's metrics path: an earlier run's non-empty file there (and its job beside it) moved
// to STEM.previous-<UTC>EXT in the same directory. Returns the new name ("" where nothing moved).
std::string move_aside(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto st = fs::symlink_status(path, ec);
  if (ec || !fs::is_regular_file(st) || fs::file_size(path, ec) == 0) return "";
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  const fs::path p(path);
  const std::string stem = (p.parent_path() / p.stem()).string() + ".previous-" + stamp;
  std::string aside = stem + p.extension().string();
  for (int i = 1; fs::exists(fs::symlink_status(aside, ec)); ++i)
    aside = stem + "-" + std::to_string(i) + p.extension().string();
  if (std::rename(path.c_str(), aside.c_str()) != 0)
    throw ConfigError(path + ": cannot move the earlier run's metrics aside to " + aside + ": " + std::strerror(errno));
  const std::string job = path + ".job.yaml";
  if (fs::is_regular_file(fs::symlink_status(job, ec))) std::rename(job.c_str(), (aside + ".job.yaml").c_str());
  return aside;
}

// `text` to `path` through a temporary file renamed over it (whole or absent).
void write_whole(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = safe_file::create_fresh(tmp);
  const bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = ok ? errno : err;
    ::unlink(tmp.c_str());
    throw ConfigError(path + ": cannot write the job beside the metrics: " + std::strerror(e));
  }
}

}  // namespace

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
}

MetricsWriter::MetricsWriter(const std::string& path, int64_t resume_step, const std::string& job_yaml) : path_(path) {
  const bool append = resume_step > 0;
  namespace fs = std::filesystem;
  THETAD_CHECK(!path.empty(), InternalError, "MetricsWriter: empty path (the worker writes no metrics then)");
  const fs::path parent = fs::path(path).parent_path();
  if (const std::string why = safe_file::make_dirs(parent.string(), false); !why.empty())
    throw ConfigError(path + ": metrics.path: cannot create the metrics directory: " + why);
  lock_fd_ = lock_metrics(path);
  try {
    // Opened (never through a link, never another user's file) before its records are read and
    // kept, and again after: keep_records_before replaces the file.
    const auto open = [&](int flags) {
      std::string why;
      fd_ = safe_file::open_own(path, O_WRONLY | flags, 0644, &why);
      if (fd_ < 0) throw ConfigError(path + ": metrics.path: cannot open the metrics file for writing: " + why);
    };
    if (!append) aside_ = move_aside(path);
    if (!job_yaml.empty()) write_whole(path + ".job.yaml", job_yaml);
    open(append ? O_APPEND : O_TRUNC | O_APPEND);
    if (append) {
      ::close(fd_);
      fd_ = -1;
      keep_records_before(path, resume_step);
      open(O_APPEND);
    }
  } catch (...) {
    if (fd_ >= 0) ::close(fd_);
    ::close(lock_fd_);  // no destructor after a throwing constructor
    throw;
  }
}

void MetricsWriter::write(const StepRecord& r) { write_line(to_json(r)); }
void MetricsWriter::write(const EvalRecord& r) { write_line(to_json(r)); }

void MetricsWriter::write_line(std::string line) {
  line += '\n';
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t at = 0; at < line.size();) {
    const ssize_t k = ::write(fd_, line.data() + at, line.size() - at);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) throw Error(path_ + ": writing metrics failed (" + std::string(k < 0 ? std::strerror(errno) : "disk full?") + ")");
    at += static_cast<size_t>(k);
  }
}

}  // namespace thetad::daemon
