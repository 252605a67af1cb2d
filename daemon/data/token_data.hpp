// Held-out token windows per task (eval.dir), read as the training token files are
// (daemon/data/token_data.cpp): the same file formats, masks and checks.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "config/job.hpp"
#include "daemon/models/model.hpp"

namespace thetad::daemon {

// A task's held-out windows: window i is its eval file's tokens [i·seq_len, i·seq_len + seq_len]
// (consecutive windows share one token, so each token but the first is a target once), the same
// windows at every evaluation.
class EvalTokens {
 public:
  virtual ~EvalTokens() = default;
  // How many whole windows the task's file holds.
  virtual int64_t windows(int task) const = 0;
  // Windows [first, first + count) of the task on the host: x the inputs, y the next tokens with
  // -1 where the loss mask (data.loss_mask) leaves a target out.
  virtual Batch rows(int task, int64_t first, int64_t count) const = 0;
};

// eval.dir's files of `tasks` (checked before the run: daemon/plan/token_files.hpp), eval.dir read
// as given: the caller expands its placeholders (with_input_paths, daemon/plan/input_path.hpp).
std::unique_ptr<EvalTokens> make_eval_tokens(const config::Job& job, const std::vector<int>& tasks);

}  // namespace thetad::daemon
