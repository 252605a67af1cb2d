// The export section of a job (Checker, checker.hpp): PEFT adapter directories and merged model
// directories, both of Hugging Face's layout, and the per-task directory patterns they share
// with lora.init_from.
#include <algorithm>
#include <filesystem>
#include <string>

#include "config/checker.hpp"
#include "config/hf_config.hpp"

namespace thetad::config::detail {

// A {task} that a later ".." takes away again ("ex/{task}/..") names one directory for every
// task: each task's adapter would overwrite (or be read from) the one before.
void Checker::per_task_dir(const char* key, const std::string& v) {
  if (v.find("{task}") == std::string::npos || !ok(key)) return;
  const std::string normal = std::filesystem::path(v).lexically_normal().string();
  if (normal.find("{task}") == std::string::npos)
    fail(key, "'" + v + "' is the same directory for every task: it normalises to '" + normal +
                  "', a later '..' undoing {task}; give each task its own directory, e.g. 'adapters/{task}'");
}

void Checker::export_section() {
  const ModelConfig& m = j_.model;
  const ExportConfig& e = j_.export_;
  const bool hf_layout = unknown("model.arch") || llama_family(m.arch);
  one_of("export.dtype");
  placeholders("export.adapters_dir", e.adapters_dir, true);
  per_task_dir("export.adapters_dir", e.adapters_dir);
  if (!e.adapters_dir.empty()) {
    if (!hf_layout && ok("model.arch"))
      fail("export.adapters_dir", "PEFT adapters are written for the Hugging Face layouts (model.arch llama, mistral, "
                                  "qwen2 or qwen3), not gpt2", "model.arch");
    else if (m.train_shared && ok("model.train_shared"))
      // A PEFT loader computes the base it is given plus the adapter: with the base trained too
      // that is not the model trained (a job measured 3.19 against the trained model's 1.66).
      fail("export.adapters_dir", std::string("PEFT adapters hold the LoRA weights alone, but model.train_shared is true") +
                                      (d_.given("model.train_shared") ? ";" : " (the default);") +
                                      " the base is trained too, so the base with an exported adapter is not the model "
                                      "trained. Set model.train_shared: false to train the adapters on a frozen base, or "
                                      "export merged models (export.merged_dir), which hold the trained base");
    if (m.tasks > 1 && e.adapters_dir.find("{task}") == std::string::npos)
      fail("export.adapters_dir", "has no {task} but model.tasks is " + num(m.tasks) + ": every task needs a directory of its own");
  }
  if (e.at_checkpoints && e.adapters_dir.empty())
    fail("export.at_checkpoints", "is true but there is no export.adapters_dir to write to", "export.adapters_dir");
  merged();
}

// export.merged_dir: a Hugging Face model directory per listed task, its config.json copied from
// model.init_from's.
void Checker::merged() {
  const ModelConfig& m = j_.model;
  const ExportConfig& e = j_.export_;
  placeholders("export.merged_dir", e.merged_dir, true);
  per_task_dir("export.merged_dir", e.merged_dir);
  if (!(e.max_shard_mb > 0) || !(e.max_shard_mb <= kMaxMiB))
    fail("export.max_shard_mb", "must be > 0 and <= " + num(kMaxMiB) + ", got " + num(e.max_shard_mb));
  if (e.merged_dir.empty()) {
    if (!e.merged_tasks.empty())
      fail("export.merged_tasks", "lists tasks but there is no export.merged_dir to write them to", "export.merged_dir");
    return;
  }
  if (!unknown("model.arch") && !llama_family(m.arch) && ok("model.arch"))
    fail("export.merged_dir", "merged models are written in the Hugging Face layouts (model.arch llama, mistral, qwen2 "
                              "or qwen3), not gpt2", "model.arch");
  std::error_code ec;
  if (ok("model.init_from") && (m.init_from.empty() || !std::filesystem::is_regular_file(hf_config_file(m.init_from), ec)))
    fail("export.merged_dir", "a merged model's config.json is model.init_from's, but " +
                                  (m.init_from.empty() ? std::string("model.init_from is empty")
                                                       : "'" + hf_config_file(m.init_from) + "' does not exist") +
                                  "; start from a Hugging Face model directory");
  if (e.merged_tasks.empty() && m.tasks > 1 && ok("model.tasks"))
    fail("export.merged_tasks", "is empty but model.tasks is " + num(m.tasks) +
                                    ": list the tasks to merge (each merged model is a copy of the whole base)",
         "export.merged_dir");
  for (size_t i = 0; i < e.merged_tasks.size(); ++i) {
    const int64_t t = e.merged_tasks[i];
    const std::string key = "export.merged_tasks[" + std::to_string(i) + "]";
    if (t < 0 || (ok("model.tasks") && t >= m.tasks))
      fail(key, "must be a task of 0 .. model.tasks - 1 (" + num(m.tasks - 1) + "), got " + num(t), "export.merged_tasks");
    else if (std::find(e.merged_tasks.begin(), e.merged_tasks.begin() + static_cast<std::ptrdiff_t>(i), t) !=
             e.merged_tasks.begin() + static_cast<std::ptrdiff_t>(i))
      fail(key, "task " + num(t) + " is listed twice", "export.merged_tasks");
  }
  if (e.merged_tasks.size() > 1 && e.merged_dir.find("{task}") == std::string::npos)
    fail("export.merged_dir", "has no {task} but export.merged_tasks lists " + num(int64_t(e.merged_tasks.size())) +
                                  " tasks: every task needs a directory of its own");
  if (!e.adapters_dir.empty() && std::filesystem::path(e.adapters_dir).lexically_normal() ==
                                     std::filesystem::path(e.merged_dir).lexically_normal())
    fail("export.merged_dir", "is export.adapters_dir ('" + e.adapters_dir + "'); a merged model and an adapter need "
                              "directories of their own");
}

}  // namespace thetad::config::detail
