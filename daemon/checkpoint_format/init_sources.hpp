// The sources of the values a checkpoint does not store (manifest.hpp's InitSources: the seed that
// draws initial groups, model.init_from, each initial task group's lora.init_from directory):
// their fingerprints read from the filesystem, and the check at resume that refuses a checkpoint
// whose unstored groups would now get other values, naming the source. Torch-free.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "daemon/checkpoint_format/manifest.hpp"

namespace thetad::daemon {

// Whether a run reads a file of this name in a model.init_from or lora.init_from directory: the
// weights (*.safetensors), their index and the configs. Anything else there (a tokenizer, notes,
// thetad's own outputs put there) changes nothing the run computes.
bool read_from_source_dir(const std::string& name);

// A path's fingerprint: a file's size and mtime; a directory's files that a run reads
// (read_from_source_dir) with their sizes summed and the newest mtime of them; `present` false
// where the path does not exist. `legacy`: the fingerprint checkpoints recorded before, over every
// regular file of a directory and the directory's own mtime (a file created or removed there
// changed it). Error naming `what` and the path where it exists but cannot be read.
InitFromPrint fingerprint_path(const std::string& path, const std::string& what, bool legacy = false);

// What the job gives unstored groups now.
struct InitSourcesNow {
  uint64_t seed = 0;         // init_seed(job)
  std::string seed_key;      // the key that sets it: "model.init_seed", else "seed"
  std::string model_path;    // model.init_from ("": none)
  std::string lora_pattern;  // lora.init_from ("": none)
  std::function<std::string(int64_t task)> lora_dir;  // task t's lora.init_from directory
};

// The unstored groups of a format-6 manifest (kRunInitial or kRunInitFrom runs) get their values
// at resume as the checkpoint recorded: the same seed, model.init_from unchanged (its path and
// fingerprint), lora.init_from the same pattern and each initial task group's directory as it
// was (changed, removed, or created since: refused). Formats 4 and 5: model.init_from only; what
// cannot be checked is returned as notes (the caller logs them). ConfigError naming the manifest
// `manifest_path`, the key, the source and both values otherwise (exit 2, before any step).
std::vector<std::string> check_init_sources(const Manifest& m, const InitSourcesNow& now, const std::string& manifest_path);

// The tasks whose groups (task + 1) are in kRunInitial runs, ascending.
std::vector<int64_t> initial_tasks(const std::vector<ManifestRun>& runs);

}  // namespace thetad::daemon
