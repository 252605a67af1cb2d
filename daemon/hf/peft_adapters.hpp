// The transformer's per-task LoRA adapters as PEFT directories (adapter_model.safetensors with
// PEFT's tensor names, adapter_config.json): read by lora.init_from, written by export.adapters_dir
// (with export.merged_dir's models).
// PEFT's LoRA computes W x + (lora_alpha / r) B A x with lora_A [r, in] and lora_B [out, r], as
// thetad's does with lora.alpha and lora.rank: the matrices go over as they are.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/job.hpp"
#include "daemon/hf/export_files.hpp"
#include "daemon/models/model.hpp"
#include "daemon/models/param_groups.hpp"

namespace thetad::daemon {

// For each task whose lora.init_from directory exists: adapter_config.json must be a LoRA of
// r = lora.rank, lora_alpha = lora.alpha and target_modules = lora.targets (a mismatch names the
// file, the key and both values; rsLoRA, DoRA, biases, fan_in_fan_out, per-layer patterns are
// refused), and adapter_model.safetensors must hold every layer's lora_A and lora_B of each
// target with the adapter's shapes (else a ConfigError naming the file and the tensor). Other
// tensors are listed in a warning. Tasks without a directory keep their fresh adapters.
void load_peft_adapters(const config::Job& job, TaskModel& model);

class MergedExport;

// The export section: PEFT adapter directories (export.adapters_dir) and merged model directories
// (export.merged_dir, daemon/hf/merged_export.hpp), in export.dtype.
class AdapterExport {
 public:
  // Checks every task's directory before any step: one that exists must be a directory of this
  // user holding nothing but a PEFT adapter's files (merged: a model directory's), and files must
  // be creatable in it (or where it does not exist yet, in the nearest directory above it): else
  // ConfigError naming the key and the path, so that an export that cannot be written fails
  // before training, not after.
  AdapterExport(const config::Job& job, const ParamGroups& groups);
  ~AdapterExport();
  // Writes, under temporary names, the adapter of each task t with t % world == rank whose
  // group's step count differs from the one it was last written at (untrained adapters are never
  // written; `all`: every trained one, whatever was written before); state(g) reads group g
  // where it lives; and at the run's end (`last`) the merged models of this rank's tasks of
  // export.merged_tasks. Every adapter's parameters are checked finite first: a NaN or an Inf is
  // Error naming the task and the parameter, and nothing is written. On any error the temporary
  // files written so far are removed. Returns how many adapters it staged.
  int stage_changed(int rank, int world, const std::vector<int64_t>& group_steps,
                    const std::function<GroupState(int)>& state, bool all = false, bool last = false);
  // Puts the staged files in place: all synced at once (syncfs), renamed, synced again.
  // Error on an I/O failure.
  void publish_staged();
  // Removes the staged temporary files (another rank failed: nothing is published).
  void discard_staged() noexcept;

 private:
  // The task's two files under temporary names, not synced; returns its directory.
  std::string write(int64_t task, const GroupState& st) const;
  // The two files of each adapter directory written (an empty name: none).
  void stage(const std::vector<std::string>& dirs);
  const config::Job& job_;
  std::vector<int64_t> written_at_;  // per group: its step count when last written (0: never)
  StagedFiles staged_;               // the files of this export not yet in place
  std::vector<std::pair<int, int64_t>> staged_steps_;  // group -> its step count, once published
  std::unique_ptr<MergedExport> merged_;               // export.merged_dir (null: none)
};

}  // namespace thetad::daemon
