// Internal to config/: the Checker that validate() runs over a parsed Job, shared by the files
// that hold its sections (validate.cpp, validate_model.cpp, validate_data.cpp,
// validate_offload.cpp). Its helpers report through Diagnostics and skip a key that already
// failed to parse, so one mistake yields one message.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "config/diagnostics.hpp"
#include "config/job.hpp"
#include "config/limits.hpp"
#include "config/load_options.hpp"
#include "config/param_counts.hpp"
#include "config/placeholders.hpp"
#include "config/schema.hpp"

namespace thetad::config::detail {

inline std::string num(double v) { return format_double(v); }
inline std::string num(int64_t v) { return std::to_string(v); }
// `elems` fp32 elements as bytes with a binary unit ("64 GiB").
std::string fp32_size(double elems);

class Checker {
 public:
  Checker(const Job& job, const LoadOptions& opts, Diagnostics& d)
      : j_(job), opts_(opts), d_(d) {}

  // The parameter counts of the built-in models, as model() finds them (param_counts).
  ParamCounts counts() {
    model();
    return counts_;
  }

  void run() {
    path_bytes();
    required();
    top_level();
    model();
    data();
    comm();
    offload();
    optimizer();
    one_of("train.on_nonfinite");
    one_of("train.backward");
    train();
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
  static constexpr double kMinTimeoutS = 1.0;                  // comm.timeout_s
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
  // Of the keys a product of sizes reads, the one to blame: one set by `--set` first (the change
  // that broke it), else one the file gives, else the first.
  std::string culprit(std::initializer_list<const char*> keys) const {
    for (const char* k : keys)
      if (d_.given(k) && d_.where(k).from_override) return k;
    for (const char* k : keys)
      if (d_.given(k)) return k;
    return *keys.begin();
  }
  // `{rank}` and `{job}` are the only placeholders of output paths (and `{task}` with `task`).
  void placeholders(const std::string& path, const std::string& v, bool task = false) {
    const std::string ph = task ? unknown_placeholder(v, {"{rank}", "{job}", "{task}"})
                                : unknown_placeholder(v, {"{rank}", "{job}"});
    if (!ph.empty())
      fail(path, "unknown placeholder '" + ph + "'; paths may use {rank}" + (task ? ", {job} and {task}" : " and {job}"));
  }
  // A path as validation looks at it: {job} expanded ({rank} and {task} as written).
  std::string with_job(const std::string& v) const {
    PathValues values;
    values.job = j_.name;
    return expand_placeholders(v, values);
  }

  // The sections (validate.cpp: required keys, top level, comm, optimizer, outputs).
  void required();
  void top_level();
  void micro_steps_fit();
  void comm();
  void optimizer();
  void train();
  void path_bytes();
  void outputs();
  void distinct_outputs();
  // validate_model.cpp
  void model();
  void transformer();
  void llama();
  void rope_llama3();
  void model_size();
  void base_quant();
  void base_shard();
  void torchscript();
  // validate_export.cpp
  void per_task_dir(const char* key, const std::string& v);
  void export_section();
  void merged();
  // validate_data.cpp
  void data();
  void data_files(int64_t T);
  void token_ids();
  void eval();
  void eval_tasks_given(int64_t T, bool tasks_ok);
  void batch_covers_tasks(int64_t T);
  void weighted(int64_t T, bool tasks_ok);
  void per_rank(int64_t T, bool tasks_ok);
  void alternate(int64_t T, bool tasks_ok);
  // validate_offload.cpp (with validate_shared)
  void offload();
  void device_cache(const std::string& v);
  void slots_cover_step();
  void activations();
  void shards();
  // Also keeps the counts (counts()).
  void offload_sizes(double shared, double per_task, double tasks_total);

  const Job& j_;
  const LoadOptions& opts_;
  Diagnostics& d_;
  ParamCounts counts_;
};

}  // namespace thetad::config::detail
