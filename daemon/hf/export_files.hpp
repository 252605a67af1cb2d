// The files of thetad's Hugging Face exports (export.adapters_dir, export.merged_dir): their
// directories checked before any step, files written under temporary names and put in place
// together once every rank wrote its share, and tensors in the export's dtype.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "config/job.hpp"

namespace thetad::daemon {

// A pattern of lora.init_from, export.adapters_dir or export.merged_dir for one task ({task},
// {job} replaced; every rank reads and writes the same directories).
std::string adapter_dir(const std::string& pattern, const config::Job& job, int64_t task);

// Checks before any step that task `task`'s directory `dir` of `key` can take an export: one
// that exists must be a directory of this user holding nothing but files `own` accepts (by name),
// and files must be creatable in it (or where it does not exist yet, in the nearest directory
// above it; each such directory once: `probed`). Else ConfigError naming the key and the path, so
// that an export that cannot be written fails before training, not after.
void check_export_dir(const std::string& key, const std::string& dir, int64_t task, const std::string& what,
                      const std::function<bool(const std::string&)>& own, std::set<std::string>& probed);

// `text` at `path` (not synced: publishing makes it durable), created anew (a leftover or planted
// name replaced, never followed: safe_file.hpp); a failure removes it. Error naming the path.
void write_text(const std::string& path, const std::string& text);

// Files written under PATH.tmp and put in place together: all synced at once (one syncfs per
// filesystem), renamed, synced again. Two syncs for any number of files, where a fsync per file
// made 10,000 adapters 20,000 journal commits; a crash leaves each file whole, old or new.
class StagedFiles {
 public:
  // `path`.tmp is written, for the export of job key `key` (named in errors).
  void add(const std::string& path, const std::string& key) { files_.push_back({path, key}); }
  // Puts them in place (Error naming the file and its key on an I/O failure).
  void publish();
  // Removes the temporary files (another rank failed: nothing is published).
  void discard() noexcept;

 private:
  struct File {
    std::string path, key;
  };
  std::vector<File> files_;
};

// A float32 tensor on the host as export.dtype writes it: contiguous bytes and safetensors' word
// (F32, BF16 or F16; rounded to nearest even). A value the dtype cannot hold (beyond fp16's range,
// NaN or Inf) is an Error naming `what`.
struct ExportTensor {
  torch::Tensor data;
  std::string dtype;
};
ExportTensor export_tensor(const torch::Tensor& fp32, config::ExportDtype dtype, const std::string& what);

}  // namespace thetad::daemon
