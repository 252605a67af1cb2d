// Semantic checks of a job: required keys, ranges, enum values and contradictions. A key that
// already failed to parse is skipped here, so one mistake yields one message.
#include "config/validate.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <limits>
#include <utility>
#include <string>

#include "config/limits.hpp"
#include "config/schema.hpp"

namespace thetad::config::detail {

namespace {

std::string num(double v) { return format_double(v); }
std::string num(int64_t v) { return std::to_string(v); }

// `elems` fp32 elements as bytes with a binary unit ("64 GiB").
std::string fp32_size(double elems) {
  static const char* const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = elems * 4;
  int u = 0;
  while (v >= 1024 && u < 6) v /= 1024, ++u;
  char buf[32];
  const bool whole = v == std::trunc(v) || v >= 10 || u == 0;
  std::snprintf(buf, sizeof buf, whole ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

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
    one_of("train.on_nonfinite");
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
    at_most<int64_t>("accumulate_steps", j_.accumulate_steps, kMaxAccumulateSteps,
                     "micro-steps of one optimizer step");
    micro_steps_fit();
    one_of("precision");
    if (!is_job_name(j_.name))
      fail("job", "must be a non-empty name of letters, digits, '.', '_' and '-', not '.' or '..' (it becomes "
                  "part of paths through {job}); got '" + j_.name + "'");
  }

  // Micro-step m of step s has index s x accumulate_steps + m: the last one must fit an int64.
  void micro_steps_fit() {
    const int64_t k = j_.accumulate_steps;
    if (!d_.given("steps") || !ok("steps") || !ok("accumulate_steps") || j_.steps <= 0 || k < 1 ||
        k > kMaxAccumulateSteps)
      return;
    const int64_t most = std::numeric_limits<int64_t>::max() / k;
    if (j_.steps > most)
      fail("steps", "steps x accumulate_steps (" + num(j_.steps) + " x " + num(k) +
                        ") micro-steps overflow the 64-bit micro-step index; with accumulate_steps " +
                        num(k) + " steps must be <= " + num(most));
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
    if (!m.init_from.empty() && ok("model.init_from")) {
      std::error_code ec;
      if (!std::filesystem::is_regular_file(m.init_from, ec))
        fail("model.init_from", "no such file: '" + m.init_from +
                                    "' (a torch.save'd state dict or a checkpoint group file)");
    }
    if (!ok("model.kind") || unknown("model.kind")) return;
    if (m.kind == ModelKind::MultitaskAdapter) {
      at_least<int64_t>("model.adapter_rank", m.adapter_rank, 1);
      at_most<int64_t>("model.adapter_rank", m.adapter_rank, kMaxDim, "a layer dimension");
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
    } else if (m.kind == ModelKind::Transformer) {
      transformer();
    }
    if (m.kind != ModelKind::Torchscript && m.kind != ModelKind::Transformer) model_size();
  }

  // The transformer's sizes and its LoRA section; its parameter count bounded as model_size does
  // for the other built-in models (daemon/models/transformer.cpp builds these shapes).
  void transformer() {
    const ModelConfig& m = j_.model;
    const LoraConfig& l = j_.lora;
    const std::pair<const char*, int64_t> dims[] = {{"model.d_model", m.d_model}, {"model.d_ff", m.d_ff},
                                                    {"model.seq_len", m.seq_len}, {"model.vocab", m.vocab}};
    const auto in = [](int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
    bool sizes_ok = in(m.layers, 1, kMaxLayers) && in(m.heads, 1, kMaxDim) && in(l.rank, 1, kMaxDim);
    for (const auto& [key, v] : dims) {
      const int64_t lo = std::string(key) == "model.vocab" ? 2 : 1;
      at_least<int64_t>(key, v, lo);
      at_most<int64_t>(key, v, kMaxDim, "a layer dimension");
      sizes_ok = sizes_ok && in(v, lo, kMaxDim);
    }
    at_least<int64_t>("model.layers", m.layers, 1);
    at_most<int64_t>("model.layers", m.layers, kMaxLayers, "layers");
    at_least<int64_t>("model.heads", m.heads, 1);
    if (sizes_ok && m.d_model % m.heads != 0)
      fail("model.heads", "must divide model.d_model (" + num(m.d_model) + ") into equal heads, got " + num(m.heads));
    at_least<int64_t>("lora.rank", l.rank, 1);
    at_most<int64_t>("lora.rank", l.rank, kMaxDim, "a layer dimension");
    if (!(l.alpha > 0) || !std::isfinite(l.alpha)) fail("lora.alpha", "must be a finite number > 0, got " + num(l.alpha));
    static const std::vector<std::string> kTargets = {"q", "k", "v", "o", "up", "down"};
    if (l.targets.empty()) fail("lora.targets", "needs at least one of q, k, v, o, up, down");
    for (size_t i = 0; i < l.targets.size(); ++i) {
      const std::string& t = l.targets[i];
      if (std::find(kTargets.begin(), kTargets.end(), t) == kTargets.end())
        fail("lora.targets[" + std::to_string(i) + "]", "must be one of q, k, v, o, up, down; got '" + t + "'");
      else if (std::find(l.targets.begin(), l.targets.begin() + static_cast<std::ptrdiff_t>(i), t) !=
               l.targets.begin() + static_cast<std::ptrdiff_t>(i))
        fail("lora.targets[" + std::to_string(i) + "]", "'" + t + "' is listed twice");
    }
    for (const char* key : {"model.d_model", "model.d_ff", "model.seq_len", "model.vocab", "model.layers",
                            "model.heads", "model.tasks", "lora.rank"})
      if (!ok(key)) return;
    if (!sizes_ok || m.tasks < 1) return;
    const double d = double(m.d_model), ff = double(m.d_ff), L = double(m.layers), r = double(l.rank);
    const double largest = std::max({double(m.vocab) * d, d * ff, d * d});
    if (largest > kMaxTensorElems) {
      fail(double(m.vocab) * d >= d * ff ? "model.vocab" : "model.d_ff",
           "the largest parameter of transformer has " + num(largest) + " elements (" + fp32_size(largest) +
               "); a parameter may have at most 2^34 = " + num(kMaxTensorElems) + " elements",
           "model");
      return;
    }
    double per_layer_lora = 0;  // r x (in + out) per adapted matrix
    for (const std::string& t : l.targets) per_layer_lora += r * (t == "up" || t == "down" ? d + ff : 2 * d);
    const double shared = 2 * double(m.vocab) * d + double(m.seq_len) * d + L * (4 * d * d + 2 * d * ff + 4 * d) + 2 * d;
    const double total = shared + double(m.tasks) * L * per_layer_lora;
    if (total > kMaxModelParams)
      fail(d_.given("model.tasks") ? "model.tasks" : "model.d_model",
           "the parameters of transformer add up to " + num(total) + " elements (" + fp32_size(total) + "): " +
               num(shared) + " shared + model.tasks (" + num(m.tasks) + ") x " + num(L * per_layer_lora) +
               " per task; a model may have at most 2^38 = " + num(kMaxModelParams) + " parameters",
           "model");
  }

  // The built-in models' parameter shapes follow from the model keys (daemon/models/models.cpp
  // builds them): the largest parameter and the total are bounded before anything is allocated.
  // Skipped while a key it reads is out of its own range (that is reported already).
  void model_size() {
    const ModelConfig& m = j_.model;
    for (const char* key : {"model.input_dim", "model.hidden", "model.output_dim", "model.trunk_layers",
                            "model.head_layers", "model.tasks", "model.adapter_rank", "model.classes",
                            "offload.shard_mb"})
      if (!ok(key)) return;
    auto in = [](int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
    if (!in(m.input_dim, 1, kMaxDim) || !in(m.hidden, 1, kMaxDim) || !in(m.output_dim, 1, kMaxDim) ||
        !in(m.trunk_layers, 0, kMaxLayers) || !in(m.head_layers, 1, kMaxLayers) || !in(m.tasks, 1, kMaxTasks))
      return;
    if (m.kind == ModelKind::MultitaskAdapter && !in(m.adapter_rank, 1, kMaxDim)) return;
    if (m.kind == ModelKind::ExtremeClassifier && !in(m.classes, m.tasks, int64_t{1} << 32)) return;

    // The largest parameter: its description, its two dimensions and the keys they come from.
    struct Largest {
      double elems = 0;
      std::string what, rkey, ckey;
      int64_t rows = 0, cols = 0;
    } big;
    auto matrix = [&](const std::string& what, int64_t rows, const char* rkey, int64_t cols, const char* ckey) {
      const double e = double(rows) * double(cols);
      if (e > big.elems) big = {e, what, rkey, ckey, rows, cols};
      return e;
    };
    const double H = double(m.hidden);
    // `n` more hidden x hidden layers with their biases (none: nothing is counted).
    auto square_layers = [&](int64_t n, const std::string& what) {
      return n > 0 ? double(n) * (matrix(what, m.hidden, "model.hidden", m.hidden, "model.hidden") + H) : 0.0;
    };
    double shared = 0, per_task = 0;  // elements of Θ and of one θ[t] (the largest slice)
    std::string per_task_keys;
    if (m.kind == ModelKind::MultitaskMlp) {
      if (m.trunk_layers >= 1)
        shared = matrix("trunk.0.weight", m.hidden, "model.hidden", m.input_dim, "model.input_dim") + H +
                 square_layers(m.trunk_layers - 1, "trunk.<i>.weight");
      const bool trunk = m.trunk_layers >= 1;
      const int64_t dim = trunk ? m.hidden : m.input_dim;
      const char* dim_key = trunk ? "model.hidden" : "model.input_dim";
      if (m.head_layers == 1) {
        per_task = matrix("heads.<t>.0.weight", m.output_dim, "model.output_dim", dim, dim_key) + double(m.output_dim);
      } else {
        per_task = matrix("heads.<t>.0.weight", m.hidden, "model.hidden", dim, dim_key) + H +
                   square_layers(m.head_layers - 2, "heads.<t>.<i>.weight") +
                   matrix("heads.<t>.<last>.weight", m.output_dim, "model.output_dim", m.hidden, "model.hidden") +
                   double(m.output_dim);
      }
      per_task_keys = "model.head_layers";
    } else if (m.kind == ModelKind::MultitaskAdapter) {
      const double blocks = double(std::max<int64_t>(m.trunk_layers, 1));
      shared = matrix("embed.weight", m.hidden, "model.hidden", m.input_dim, "model.input_dim") + H +
               square_layers(2 * std::max<int64_t>(m.trunk_layers, 1), "blocks.<i>.fc1.weight");
      per_task = 2 * blocks * matrix("adapters.<t>.<i>.down", m.adapter_rank, "model.adapter_rank", m.hidden, "model.hidden") +
                 matrix("heads.<t>.weight", m.output_dim, "model.output_dim", m.hidden, "model.hidden") +
                 double(m.output_dim);
      per_task_keys = "model.adapter_rank";
    } else if (m.kind == ModelKind::ExtremeClassifier) {
      shared = matrix("encoder.0.weight", m.hidden, "model.hidden", m.input_dim, "model.input_dim") + H +
               square_layers(std::max<int64_t>(m.trunk_layers, 1) - 1, "encoder.<i>.weight");
      const int64_t rows = m.classes / m.tasks + (m.classes % m.tasks ? 1 : 0);  // the largest slice
      const bool sharded = j_.offload.shard_mb > 0;
      matrix(sharded ? "output.<t>.weight_bias" : "output.<t>.weight", rows, "model.classes",
             sharded ? m.hidden + 1 : m.hidden, "model.hidden");
      per_task = double(rows) * (H + 1);
      per_task_keys = "model.classes";
    }
    if (big.elems > kMaxTensorElems) {
      // At the key of the parameter's dimensions that the file gives (else the section's line).
      const std::string key = d_.given(big.rkey) || !d_.given(big.ckey) ? big.rkey : big.ckey;
      fail(key, "the largest parameter of " + to_string(m.kind) + ", " + big.what + " [" + big.rkey +
                    " x " + big.ckey + " = " + num(big.rows) + " x " + num(big.cols) + "], has " +
                    num(big.elems) + " elements (" + fp32_size(big.elems) + "); a parameter may have at most 2^34 = " +
                    num(kMaxTensorElems) + " elements (" + fp32_size(kMaxTensorElems) + ")",
           "model");
      return;
    }
    // The extreme classifier's slices add up to classes rows, not tasks x the largest.
    const double tasks_total = m.kind == ModelKind::ExtremeClassifier ? double(m.classes) * (H + 1)
                                                                      : double(m.tasks) * per_task;
    const double total = shared + tasks_total;
    if (total > kMaxModelParams) {
      const std::string key = m.kind == ModelKind::ExtremeClassifier ? "model.classes"
                              : d_.given("model.tasks")                ? "model.tasks"
                                                                       : "model.hidden";
      const std::string tasks_part = m.kind == ModelKind::ExtremeClassifier
          ? "model.classes x (model.hidden + 1) = " + num(m.classes) + " x " + num(m.hidden + 1)
          : "model.tasks (" + num(m.tasks) + ") x " + num(per_task) + " per task";
      fail(key, "the parameters of " + to_string(m.kind) + " add up to " + num(total) + " elements (" +
                    fp32_size(total) + "): " + num(shared) + " shared + " + tasks_part +
                    " (model.input_dim, model.hidden, model.output_dim, model.trunk_layers, " + per_task_keys +
                    "); a model may have at most 2^38 = " + num(kMaxModelParams) + " parameters (" +
                    fp32_size(kMaxModelParams) + ")",
           "model");
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
      fail("model.task", "torchscript needs the name pattern(s) of the per-task parameters, e.g. "
                         "\"heads.{t}.*\" or [\"adapters.{t}.*\", \"heads.{t}.*\"]", "model.kind");
    for (size_t i = 0; i < m.task.size(); ++i) {
      const std::string key = m.task.size() == 1 ? "model.task" : "model.task[" + std::to_string(i) + "]";
      if (m.task[i].find("{t}") == std::string::npos)
        fail(key, "pattern must contain {t} (the task index 0..T-1); got '" + m.task[i] + "'");
    }
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
    if (is("data.kind", dc.kind, DataKind::Tokens) && dc.dir.empty())
      fail("data.dir", "required when data.kind is 'tokens' (directory of task{t}.npy token files)", "data.kind");
    const bool transformer = is("model.kind", j_.model.kind, ModelKind::Transformer);
    if (is("data.kind", dc.kind, DataKind::Tokens) && ok("model.kind") && !transformer &&
        !is("model.kind", j_.model.kind, ModelKind::Torchscript))
      fail("data.kind", "'tokens' is for the transformer and TorchScript language models; model.kind is '" +
                            to_string(j_.model.kind) + "'");
    if (transformer && is("data.kind", dc.kind, DataKind::Npy))
      fail("data.kind", "the transformer reads tokens: 'synthetic' or 'tokens', not 'npy'");
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
    else if (!std::isfinite(sum))
      fail("data.weights", "the weights must have a finite sum (they are relative frequencies: scale "
                           "them down), got " + num(sum));
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
    one_of("comm.grad_dtype");
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
    // A bucket of 0 bytes (mib_to_bytes truncates) holds nothing: at least one fp32 element.
    for (const auto& [key, v] : {std::pair<const char*, double>{"comm.bucket_cap_mb", c.bucket_cap_mb},
                                 {"comm.first_bucket_mb", c.first_bucket_mb}})
      if (v > 0 && double(mib_to_bytes(v)) < kMinBucketBytes)
        fail(key, "must be at least 4 bytes (one fp32 element), " + num(kMinBucketBytes / 1048576.0) +
                      " MiB; got " + num(v) + " MiB (" + std::to_string(mib_to_bytes(v)) + " bytes)");
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
    at_most<int64_t>("offload.prefetch", o.prefetch, kMaxPrefetch, "steps planned ahead at every step");
    at_most<int64_t>("offload.cpu_threads", o.cpu_threads, kMaxCpuThreads, "threads of one rank");
    for (const auto& [key, v] : {std::pair<const char*, double>{"offload.device_budget_mb", o.device_budget_mb},
                                 {"offload.shard_mb", o.shard_mb}, {"offload.host_limit_mb", o.host_limit_mb}})
      at_most(key, v, kMaxMiB, "1 PiB");
    device_cache(o.device_cache_mb);
    if (o.shard_mb > 0 && o.shard_mb <= kMaxMiB && ok("offload.shard_mb") && ok("model.kind")) shards();
    if (o.enabled && o.device_budget_mb == 0 && ok("offload.device_budget_mb") && ok("offload.enabled"))
      slots_cover_step();
    if (o.activations && ok("offload.activations") && ok("model.kind")) activations();
    if (o.enabled && is("optimizer.kind", j_.optimizer.kind, OptimizerKind::Sgd))
      fail("offload.enabled", "the host store steps Adam/AdamW only; set optimizer.kind to adam or "
                              "adamw, or offload.enabled to false", "optimizer.kind");
    one_of("offload.shared");
    validate_shared(j_, d_);
  }

  // "auto" or a size in MiB: a number written as one (YAML gives it to the string key as is).
  void device_cache(const std::string& v) {
    if (v == "auto") return;
    char* end = nullptr;
    const double mib = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || !(mib >= 0) || mib > kMaxMiB)
      fail("offload.device_cache_mb", "expected auto or a size in MiB from 0 to 1 PiB, got \"" + v + "\"");
  }

  // Every task group a rank uses in an optimizer step (the union over its micro-steps) is held in
  // a device slot from the step's start to its optimizer step (daemon/store_bridge prepare_step),
  // so device_slots (no device_budget_mb) must cover the most groups a step can use. Round robin:
  // the worst case over world sizes (exact with one rank). Row-sharded groups (extreme_classifier
  // with shard_mb) stream their shards instead; the store checks their 2 slots.
  void slots_cover_step() {
    const int64_t slots = j_.offload.device_slots;
    const int64_t T = j_.model.tasks, k = j_.data.tasks_per_rank, A = j_.accumulate_steps;
    const DataConfig& dc = j_.data;
    if (!ok("offload.device_slots") || slots < 1 || !ok("model.tasks") || T < 1 || T > kMaxTasks ||
        !ok("accumulate_steps") || A < 1 || A > kMaxAccumulateSteps || !ok("data.schedule") ||
        unknown("data.schedule") || !ok("model.kind") || unknown("model.kind"))
      return;
    if (j_.model.kind == ModelKind::ExtremeClassifier && j_.offload.shard_mb > 0) return;
    int64_t groups = 0;
    std::string why;
    switch (dc.schedule) {
      case ScheduleKind::RoundRobin:
      case ScheduleKind::Weighted: {
        if (!ok("data.tasks_per_rank") || k < 1 || k > std::min(T, kMaxTasksPerRank)) return;
        int64_t distinct = T;  // weighted: a task of weight 0 is never drawn
        std::string cap = "model.tasks";
        if (dc.schedule == ScheduleKind::Weighted) {
          if (!ok("data.weights") || static_cast<int64_t>(dc.weights.size()) != T) return;
          distinct = std::count_if(dc.weights.begin(), dc.weights.end(), [](double w) { return w > 0; });
          cap = "the tasks of weight > 0";
        }
        groups = std::min(k * A, distinct);  // k, A <= 2^20: no overflow
        why = "data.tasks_per_rank x accumulate_steps = " + num(k) + " x " + num(A) + ", at most " + cap +
              " (" + num(distinct) + ")";
        break;
      }
      case ScheduleKind::PerRank:
        if (!ok("data.per_rank")) return;
        for (const auto& list : dc.per_rank) groups = std::max<int64_t>(groups, list.size());
        why = "the longest list of data.per_rank; the same tasks every micro-step";
        break;
      case ScheduleKind::All:
      case ScheduleKind::Alternate:
        groups = T;
        why = "every task, model.tasks";
        break;
    }
    if (slots < groups)
      fail("offload.device_slots",
           "is " + num(slots) + ", fewer than the " + num(groups) + " task groups a rank can use in one "
           "optimizer step with schedule '" + to_string(dc.schedule) + "' (" + why + "), all held on the "
           "device until the step's optimizer; raise it to >= " + num(groups) +
               " or set offload.device_budget_mb",
           "offload.enabled");
  }

  // Activation offload: the models whose trunk runs through trunk_layer (daemon/models). The
  // others would keep every activation on the device, so the key is refused, not ignored.
  void activations() {
    const ModelKind k = j_.model.kind;
    if (is("model.kind", k, ModelKind::MultitaskMlp) || is("model.kind", k, ModelKind::ExtremeClassifier)) return;
    const std::string* word = unknown("model.kind");
    fail("offload.activations",
         "activation offload covers the trunk layers of model.kind multitask_mlp and the encoder of "
         "extreme_classifier; '" + (word ? *word : to_string(k)) +
             "' keeps its activations on the device (use false)",
         "model.kind");
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
    distinct_outputs();
  }

  // Two outputs on one path would write one garbage file (or a file where a directory goes).
  void distinct_outputs() {
    const std::pair<const char*, const std::string*> outs[] = {{"checkpoint.dir", &j_.checkpoint.dir},
                                                               {"metrics.path", &j_.metrics.path},
                                                               {"log.file", &j_.log.file},
                                                               {"timeline.path", &j_.timeline.path}};
    for (size_t i = 0; i < std::size(outs); ++i)
      for (size_t k = 0; k < i; ++k)
        if (!outs[i].second->empty() && *outs[i].second == *outs[k].second)
          fail(outs[i].first, "is the same path as " + std::string(outs[k].first) + " ('" + *outs[i].second +
                                  "'); each output needs a path of its own", outs[k].first);
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
