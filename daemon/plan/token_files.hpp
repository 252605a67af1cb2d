// The token files a job reads (data.kind: tokens, eval.dir), checked before anything starts: only
// the tasks a run uses need files (the schedule says which train; eval.tasks which are
// evaluated), each file whole (its size a whole number of ids, at least one window, every id
// below model.vocab: one sequential read of the file), and with data.loss_mask its mask beside
// it. `thetad validate` and every rank of `thetad run` call check_token_inputs; the data sources
// (daemon/data/token_data.cpp) then only open the files. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/job.hpp"

namespace thetad::daemon {

// dir/task{t}.npy or dir/task{t}.bin (data.token_dtype), and its mask dir/task{t}.mask.bin.
std::string token_file(const std::string& dir, const config::Job& job, int64_t task);
std::string mask_file(const std::string& dir, int64_t task);

// What one token file holds: its ids and the largest of them.
struct TokenFileFacts {
  int64_t tokens = 0;
  int64_t max_id = 0;
};

// Reads the whole file once (in 1 MiB blocks; .npy through its map): a regular file of
// data.token_dtype ids (.npy: 1-D int64, int32 or uint16; uint16 only where model.vocab fits it),
// at least `min_tokens` of them, each in [0, model.vocab). ConfigError naming the file, and the
// position of an id out of range, otherwise. `what` says what the file is for ("task 3's token
// ids").
TokenFileFacts scan_token_file(const std::string& path, const config::Job& job, int64_t min_tokens, const std::string& what);
// A loss mask: a regular file of `tokens` bytes, each 0 or 1 (ConfigError naming the file and the
// first other byte's position).
void scan_mask_file(const std::string& path, int64_t tokens, const std::string& what);

// Per task (size model.tasks): whether a run of `world` ranks trains it in any of its steps.
std::vector<uint8_t> tasks_trained(const config::Job& job, int world);
// The tasks an evaluation covers at `completed` steps (eval.tasks): all, the listed ones, or those
// trained in the steps since the previous evaluation point (eval.every_steps; the run's start for
// the first), ascending.
std::vector<int> eval_tasks_at(const config::Job& job, int world, int64_t completed);
// Every task eval.tasks may cover in the run (all; the list; those trained at all).
std::vector<int> eval_tasks_of_run(const config::Job& job, int world);

// The token files (and masks) of the tasks a run of `world` ranks trains and evaluates, in
// data.dir and eval.dir as given: the caller expands their placeholders for its rank
// (with_input_paths, input_path.hpp). Returns how many files it read; ConfigError (exit 2) on the
// first problem.
int64_t check_token_inputs(const config::Job& job, int world);

}  // namespace thetad::daemon
