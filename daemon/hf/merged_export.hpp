// export.merged_dir: per task of export.merged_tasks a Hugging Face model directory of the base
// with that task's LoRA adapters folded into the matrices they adapt (W + alpha / r · B A), which
// transformers' AutoModelForCausalLM.from_pretrained loads as it loads the base: model.init_from's
// config.json (torch_dtype set to export.dtype's), its tokenizer and generation files, and the
// weights under their Hugging Face names in safetensors files of at most export.max_shard_mb
// (model.safetensors, or model-0000k-of-0000n.safetensors listed by model.safetensors.index.json).
#pragma once

#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "config/job.hpp"
#include "daemon/hf/export_files.hpp"
#include "daemon/models/param_groups.hpp"

namespace thetad::daemon {

class MergedExport {
 public:
  // Checks every listed task's directory before any step (as the adapters' are, for a model
  // directory's files): else ConfigError naming export.merged_dir and the path.
  MergedExport(const config::Job& job, const ParamGroups& groups);
  // Writes under temporary names, added to `staged`, the merged model of each task t of
  // export.merged_tasks with t % world == rank: Θ's values from the model, task t's adapters
  // through state(t + 1). A value the dtype cannot hold (NaN, Inf, beyond fp16) is Error naming
  // the task and the tensor; what was written stays in `staged` for the caller to discard.
  void stage(int rank, int world, const std::function<GroupState(int)>& state, StagedFiles& staged);
  // Once the staged files are in place: removes from those directories the weight files of an
  // earlier export that this one did not write (another number of shards), which a loader would
  // otherwise read (model.safetensors before an index).
  void published() noexcept;

 private:
  // Task t's files under temporary names in `dir`.
  void write(int64_t task, const std::string& dir, const GroupState& adapters, StagedFiles& staged);
  const config::Job& job_;
  const ParamGroups& groups_;
  std::vector<std::pair<std::string, std::set<std::string>>> written_;  // directory -> its weight files
};

}  // namespace thetad::daemon
