// Semantic checks of a job: required keys, ranges, enum values and contradictions. A key that
// already failed to parse is skipped here, so one mistake yields one message.
#include "config/validate.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <string>

#include "config/limits.hpp"
#include "config/schema.hpp"

namespace thetad::config::detail {

namespace {

std::string num(double v) { return format_double(v); }
std::string num(int64_t v) { return std::to_string(v); }

class Checker {
 public:
  Checker(const Job& job, const LoadOptions& opts, Diagnostics& d)
      : j_(job), opts_(opts), d_(d) {}

  void run() {
    required();
    top_level();
    model();
    data();
    comm();
    offload();
    optimizer();
    outputs();
  }

 private:
  // Reports unless `path` (or `anchor`) already failed to parse.
  void fail(const std::string& path, const std::string& what, const std::string& anchor = "") {
    if (d_.bad(path) || (!anchor.empty() && d_.bad(anchor))) return;
    d_.error(path, what, anchor);
  }
  bool ok(const std::string& path) const { return !d_.bad(path); }

  template <typename T>
  void at_least(const std::string& path, T v, T lo) {
    if (!(v >= lo)) fail(path, "must be >= " + num(lo) + ", got " + num(v));
  }
  template <typename T>
  void above(const std::string& path, T v, T lo) {
    if (!(v > lo)) fail(path, "must be > " + num(lo) + ", got " + num(v));
  }
  // Upper bounds far beyond any machine: sizes past them cannot be allocated, and products of
  // them would overflow the size arithmetic downstream (reported here with file and line).
  template <typename T>
  void at_most(const std::string& path, T v, T hi, const std::string& why) {
    if (v > hi) fail(path, "must be <= " + num(hi) + " (" + why + "), got " + num(v));
  }
  static constexpr int64_t kMaxDim = int64_t{1} << 24;        // one layer's rows or columns
  static constexpr int64_t kMaxLayers = 1024;
  static constexpr double kMaxMiB = double(int64_t{1} << 30);  // 1 PiB
  // An enum key whose word was not one of its values (reader.cpp kept the word).
  const std::string* unknown(const std::string& path) const { return d_.unknown_word(path); }
  // `v == want`, false while the key holds an unknown word (its value is then meaningless).
  template <typename E>
  bool is(const std::string& path, E v, E want) const { return !unknown(path) && v == want; }
  void one_of(const std::string& path) {
    if (const std::string* word = unknown(path)) one_of(path, *word);
  }
  void one_of(const std::string& path, const std::string& v) {
    const auto* allowed = allowed_values(path);
    for (const auto& a : *allowed)
      if (v == a) return;
    std::string what = "must be one of " + join(*allowed) + "; got '" + v + "'";
    const std::string near = nearest(v, *allowed);
    if (!near.empty()) what += " (did you mean '" + near + "'?)";
    fail(path, what);
  }
  // `{rank}` and `{job}` are the only placeholders of output paths.
  void placeholders(const std::string& path, const std::string& v) {
    for (size_t open = v.find('{'); open != std::string::npos; open = v.find('{', open + 1)) {
      const size_t close = v.find('}', open);
      const std::string ph = v.substr(open, close == std::string::npos ? std::string::npos
                                                                       : close - open + 1);
      if (ph != "{rank}" && ph != "{job}") {
        fail(path, "unknown placeholder '" + ph + "'; paths may use {rank} and {job}");
        return;
      }
    }
  }

  void required() {
    if (!d_.given("steps")) fail("steps", "required key is missing (number of steps to run)");
    for (const char* section : {"model", "data"}) {
      if (!d_.given(section))
        fail(section, "required section is missing (see docs/configuration.md)");
    }
    if (d_.given("model") && !d_.given("model.kind"))
      fail("model.kind", "required key is missing; one of " + join(*allowed_values("model.kind")),
           "model");
  }

  void top_level() {
    if (d_.given("steps")) above<int64_t>("steps", j_.steps, 0);
    at_least<int64_t>("accumulate_steps", j_.accumulate_steps, 1);
    one_of("precision");
    bool name_ok = !j_.name.empty();
    for (char c : j_.name)
      name_ok = name_ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.');
    if (!name_ok)
      fail("job", "must be a non-empty name of letters, digits, '.', '_' and '-' (it becomes part "
                  "of paths through {job}); got '" + j_.name + "'");
  }

  void model() {
    const ModelConfig& m = j_.model;
    one_of("model.kind");
    above<int64_t>("model.tasks", m.tasks, 0);
    above<int64_t>("model.input_dim", m.input_dim, 0);
    above<int64_t>("model.hidden", m.hidden, 0);
    above<int64_t>("model.output_dim", m.output_dim, 0);
    at_least<int64_t>("model.trunk_layers", m.trunk_layers, 0);
    at_least<int64_t>("model.head_layers", m.head_layers, 1);
    at_most<int64_t>("model.tasks", m.tasks, kMaxTasks, "task groups, each with its own parameters");
    for (const auto& [key, v] : {std::pair<const char*, int64_t>{"model.input_dim", m.input_dim},
                                 {"model.hidden", m.hidden}, {"model.output_dim", m.output_dim}})
      at_most<int64_t>(key, v, kMaxDim, "a layer dimension; a square layer of it is 1 PiB");
    at_most<int64_t>("model.trunk_layers", m.trunk_layers, kMaxLayers, "layers");
    at_most<int64_t>("model.head_layers", m.head_layers, kMaxLayers, "layers");
    at_most<int64_t>("model.classes", m.classes, int64_t{1} << 32, "output rows");
    at_least<int64_t>("model.init_seed", m.init_seed, -1);
    if (!ok("model.kind") || unknown("model.kind")) return;
    if (m.kind == ModelKind::MultitaskAdapter) {
      at_least<int64_t>("model.adapter_rank", m.adapter_rank, 1);
    } else if (m.kind == ModelKind::ExtremeClassifier) {
      if (m.classes <= 0) {
        fail("model.classes", "extreme_classifier needs classes > 0, got " + num(m.classes),
             "model.kind");
      } else if (ok("model.tasks") && m.tasks > 0 && m.classes < m.tasks) {
        fail("model.classes", "must be >= model.tasks (" + num(m.tasks) +
                                  "): each task owns a slice of the output layer; got " +
                                  num(m.classes));
      }
      at_least<int64_t>("model.negatives_per_step", m.negatives_per_step, 0);
      if (m.classes > 0 && m.negatives_per_step > m.classes)
        fail("model.negatives_per_step", "must be <= model.classes (" + num(m.classes) +
                                             "), got " + num(m.negatives_per_step));
    } else if (m.kind == ModelKind::Torchscript) {
      torchscript();
    }
  }

  void torchscript() {
    const ModelConfig& m = j_.model;
    if (m.path.empty()) {
      fail("model.path", "torchscript needs the path of the exported model file", "model.kind");
    } else if (ok("model.path") && m.path.find("{rank}") == std::string::npos) {
      placeholders("model.path", m.path);
      std::string p = m.path;
      for (size_t at; (at = p.find("{job}")) != std::string::npos;) p.replace(at, 5, j_.name);
      std::error_code ec;
      if (!std::filesystem::is_regular_file(p, ec))
        fail("model.path", "no such file: '" + p + "' (relative paths are resolved against the "
                           "current directory)");
    }
    if (m.shared.empty())
      fail("model.shared", "torchscript needs name patterns of the shared parameters, e.g. "
                           "[\"trunk.*\"]", "model.kind");
    for (size_t i = 0; i < m.shared.size(); ++i)
      if (m.shared[i].empty())
        fail("model.shared[" + std::to_string(i) + "]", "empty pattern");
    if (m.task.empty())
      fail("model.task", "torchscript needs the name pattern of the per-task parameters, e.g. "
                         "\"heads.{t}.*\"", "model.kind");
    else if (m.task.find("{t}") == std::string::npos)
      fail("model.task", "pattern must contain {t} (the task index 0..T-1); got '" + m.task + "'");
  }

  void data() {
    const DataConfig& dc = j_.data;
    const int64_t T = j_.model.tasks;
    const bool tasks_ok = ok("model.tasks") && T > 0;
    one_of("data.kind");
    one_of("data.schedule");
    above<int64_t>("data.batch_per_rank", dc.batch_per_rank, 0);
    at_most<int64_t>("data.batch_per_rank", dc.batch_per_rank, kMaxDim, "rows of one rank's batch");
    at_least("data.noise", dc.noise, 0.0);
    if (is("data.kind", dc.kind, DataKind::Npy) && dc.dir.empty())
      fail("data.dir", "required when data.kind is 'npy' (directory of task{t}_x.npy, "
                       "task{t}_y.npy)", "data.kind");
    placeholders("data.dir", dc.dir);
    at_least<int64_t>("data.tasks_per_rank", dc.tasks_per_rank, 1);
    if (tasks_ok && dc.tasks_per_rank > T)
      fail("data.tasks_per_rank", "must be <= model.tasks (" + num(T) + "), got " +
                                      num(dc.tasks_per_rank));
    // With an unknown schedule nothing below could fail (a batch is split into one slice).
    if (!ok("data.schedule") || unknown("data.schedule")) return;
    if (dc.schedule == ScheduleKind::RoundRobin || dc.schedule == ScheduleKind::Weighted)
      at_most<int64_t>("data.tasks_per_rank", dc.tasks_per_rank, kMaxTasksPerRank,
                       "tasks one rank draws in a step");
    if (dc.schedule == ScheduleKind::Weighted) weighted(T, tasks_ok);
    if (dc.schedule == ScheduleKind::PerRank) per_rank(T, tasks_ok);
    if (dc.schedule == ScheduleKind::Alternate) alternate(T, tasks_ok);
    if (tasks_ok) batch_covers_tasks(T);
  }

  // A rank's batch is cut into one slice per task of its step; each slice needs a row.
  void batch_covers_tasks(int64_t T) {
    const DataConfig& dc = j_.data;
    int64_t slices = 1;
    if (dc.schedule == ScheduleKind::RoundRobin) slices = std::min(dc.tasks_per_rank, T);
    if (dc.schedule == ScheduleKind::Weighted) slices = dc.tasks_per_rank;
    if (dc.schedule == ScheduleKind::All || dc.schedule == ScheduleKind::Alternate) slices = T;
    for (const auto& tasks : dc.per_rank)
      if (dc.schedule == ScheduleKind::PerRank) slices = std::max<int64_t>(slices, tasks.size());
    if (dc.batch_per_rank > 0 && dc.batch_per_rank < slices && ok("data.tasks_per_rank") &&
        ok("data.per_rank"))
      fail("data.batch_per_rank", "is smaller than the " + num(slices) + " tasks a rank's batch "
                                  "is split into with schedule '" + to_string(dc.schedule) + "'; got " +
                                  num(dc.batch_per_rank), "data.schedule");
  }

  void weighted(int64_t T, bool tasks_ok) {
    const auto& w = j_.data.weights;
    if (w.empty()) {
      fail("data.weights", "schedule 'weighted' needs one weight per task", "data.schedule");
      return;
    }
    if (tasks_ok && static_cast<int64_t>(w.size()) != T)
      fail("data.weights", "needs one weight per task: " + num(T) + " (model.tasks), got " +
                               std::to_string(w.size()));
    double sum = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      if (w[i] < 0) fail("data.weights[" + std::to_string(i) + "]", "must be >= 0, got " + num(w[i]));
      sum += w[i] > 0 ? w[i] : 0;
    }
    if (sum <= 0) fail("data.weights", "at least one weight must be > 0");
    else if (!std::isfinite(sum)) fail("data.weights", "the weights must have a finite sum, got " + num(sum));
  }

  void per_rank(int64_t T, bool tasks_ok) {
    const auto& pr = j_.data.per_rank;
    if (pr.empty()) {
      fail("data.per_rank", "schedule 'per_rank' needs a list of task ids for each rank, e.g. "
                            "[[0, 1], [2, 3]]", "data.schedule");
      return;
    }
    for (size_t r = 0; r < pr.size(); ++r) {
      const std::string rp = "data.per_rank[" + std::to_string(r) + "]";
      if (pr[r].empty()) fail(rp, "rank " + std::to_string(r) + " has no tasks");
      for (size_t i = 0; i < pr[r].size(); ++i) {
        const std::string ip = rp + "[" + std::to_string(i) + "]";
        if (tasks_ok && (pr[r][i] < 0 || pr[r][i] >= T))
          fail(ip, "task id must be in [0, " + num(T) + ") (tasks are numbered from 0), got " +
                       num(pr[r][i]));
        for (size_t k = 0; k < i; ++k)
          if (pr[r][k] == pr[r][i]) fail(ip, "task " + num(pr[r][i]) + " is listed twice for rank " + std::to_string(r));
      }
    }
  }

  void alternate(int64_t T, bool tasks_ok) {
    const auto& alt = j_.data.alternate;
    if (alt.empty()) {
      fail("data.alternate", "schedule 'alternate' needs the groups to train in turn, e.g. "
                             "[shared, tasks] or [shared, \"task:0\"]", "data.schedule");
      return;
    }
    for (size_t i = 0; i < alt.size(); ++i) {
      const std::string& e = alt[i];
      const std::string ip = "data.alternate[" + std::to_string(i) + "]";
      AlternateEntry entry;
      if (!AlternateEntry::parse(e, entry))
        fail(ip, "must be 'shared', 'tasks' or 'task:N' (N a task id); got '" + e + "'");
      else if (entry.kind == AlternateEntry::Kind::Task && tasks_ok && entry.task >= T)
        fail(ip, "task id must be in [0, " + num(T) + ") (tasks are numbered from 0), got '" + e + "'");
    }
  }

  void comm() {
    const CommConfig& c = j_.comm;
    one_of("comm.backend");
    one_of("comm.average");
    one_of("comm.active");
    if (is("comm.backend", c.backend, Backend::Nccl) && !opts_.cuda_build)
      fail("comm.backend", "'nccl' is not available: this build has no CUDA LibTorch "
                           "(use 'auto' or 'mpi')");
    above("comm.bucket_cap_mb", c.bucket_cap_mb, 0.0);
    above("comm.first_bucket_mb", c.first_bucket_mb, 0.0);
    if (c.first_bucket_mb > 0 && c.bucket_cap_mb > 0 && c.first_bucket_mb > c.bucket_cap_mb &&
        ok("comm.bucket_cap_mb")) {
      const bool cap_given = d_.given("comm.bucket_cap_mb") && !d_.given("comm.first_bucket_mb");
      fail(cap_given ? "comm.bucket_cap_mb" : "comm.first_bucket_mb",
           "comm.first_bucket_mb (" + num(c.first_bucket_mb) +
               ") must be <= comm.bucket_cap_mb (" + num(c.bucket_cap_mb) + ")");
    }
    above("comm.timeout_s", c.timeout_s, 0.0);
    at_most("comm.timeout_s", c.timeout_s, 1e7, "116 days");
    at_most("comm.bucket_cap_mb", c.bucket_cap_mb, kMaxMiB, "1 PiB");
    at_most("comm.first_bucket_mb", c.first_bucket_mb, kMaxMiB, "1 PiB");
  }

  void offload() {
    const OffloadConfig& o = j_.offload;
    at_least<int64_t>("offload.device_slots", o.device_slots, 1);
    at_least("offload.device_budget_mb", o.device_budget_mb, 0.0);
    at_least<int64_t>("offload.prefetch", o.prefetch, 0);
    at_least("offload.shard_mb", o.shard_mb, 0.0);
    at_least("offload.host_limit_mb", o.host_limit_mb, 0.0);
    at_least<int64_t>("offload.cpu_threads", o.cpu_threads, 0);
    for (const auto& [key, v] : {std::pair<const char*, double>{"offload.device_budget_mb", o.device_budget_mb},
                                 {"offload.shard_mb", o.shard_mb}, {"offload.host_limit_mb", o.host_limit_mb}})
      at_most(key, v, kMaxMiB, "1 PiB");
    if (o.shard_mb > 0 && o.shard_mb <= kMaxMiB && ok("offload.shard_mb") && ok("model.kind")) shards();
    if (o.enabled && is("optimizer.kind", j_.optimizer.kind, OptimizerKind::Sgd))
      fail("offload.enabled", "the host store steps Adam/AdamW only; set optimizer.kind to adam or "
                              "adamw, or offload.enabled to false", "optimizer.kind");
  }

  // Row shards inside a group: only the extreme classifier computes over them (its full softmax
  // streams the slice in chunks of shard_mb), with or without offload.
  void shards() {
    const ModelConfig& m = j_.model;
    if (!is("model.kind", m.kind, ModelKind::ExtremeClassifier)) {
      const std::string* word = unknown("model.kind");
      fail("offload.shard_mb", "row shards are computed by model.kind extreme_classifier only; '" +
                                   (word ? *word : to_string(m.kind)) +
                                   "' computes each task group whole (use 0)");
    } else if (ok("model.hidden") && m.hidden > 0 && m.hidden <= kMaxDim &&
               j_.offload.shard_bytes() < static_cast<size_t>(m.hidden + 1) * sizeof(float)) {
      fail("offload.shard_mb", "must hold one row of the output layer, (model.hidden + 1) x 4 = " +
                                   num(static_cast<int64_t>((m.hidden + 1) * 4)) + " bytes; got " +
                                   num(j_.offload.shard_mb) + " MiB");
    }
  }

  void optimizer() {
    const OptimizerConfig& o = j_.optimizer;
    one_of("optimizer.kind");
    one_of("optimizer.lr_schedule");
    above("optimizer.lr", o.lr, 0.0);
    const double betas[2] = {o.beta1, o.beta2};
    for (int i = 0; i < 2; ++i) {
      if (!(betas[i] >= 0 && betas[i] < 1))
        fail("optimizer.betas[" + std::to_string(i) + "]",
             "beta" + std::to_string(i + 1) + " must be in [0, 1), got " + num(betas[i]));
    }
    above("optimizer.eps", o.eps, 0.0);
    at_least("optimizer.weight_decay", o.weight_decay, 0.0);
    at_least("optimizer.clip_norm", o.clip_norm, 0.0);
    at_least<int64_t>("optimizer.warmup_steps", o.warmup_steps, 0);
    at_least("optimizer.min_lr", o.min_lr, 0.0);
    if (o.min_lr > o.lr && o.lr > 0 && ok("optimizer.lr"))
      fail("optimizer.min_lr", "must be <= optimizer.lr (" + num(o.lr) + "), got " + num(o.min_lr));
  }

  void outputs() {
    const CheckpointConfig& c = j_.checkpoint;
    at_least<int64_t>("checkpoint.every_steps", c.every_steps, 0);
    at_least<int64_t>("checkpoint.keep", c.keep, 1);
    placeholders("checkpoint.dir", c.dir);
    if (c.every_steps > 0 && c.dir.empty())
      fail("checkpoint.dir", "checkpoint.every_steps is " + num(c.every_steps) +
                                 " but there is no checkpoint.dir to write to",
           "checkpoint.every_steps");
    placeholders("metrics.path", j_.metrics.path);
    if (j_.metrics.all_ranks && !j_.metrics.path.empty() &&
        j_.metrics.path.find("{rank}") == std::string::npos)
      fail("metrics.path", "metrics.all_ranks is true, so the path needs {rank} (every rank "
                           "would write the same file)", "metrics.all_ranks");
    one_of("log.level", j_.log.level);
    placeholders("log.file", j_.log.file);
    at_least("log.progress_every_s", j_.log.progress_every_s, 0.0);
    placeholders("timeline.path", j_.timeline.path);
  }

  const Job& j_;
  const LoadOptions& opts_;
  Diagnostics& d_;
};

}  // namespace

void validate(const Job& job, const LoadOptions& opts, Diagnostics& diag) {
  Checker(job, opts, diag).run();
}

}  // namespace thetad::config::detail
