// The paths of a job's inputs (data.dir, model.path, eval.dir) as one rank reads them: the placeholders
// {job} and {rank} expanded once the rank is known, by the one expansion of every path
// (config::expand_path, config/placeholders.hpp).
#pragma once

#include "config/job.hpp"

namespace thetad::daemon {

// `job` with data.dir, model.path and eval.dir expanded for `rank` (the single-process reference
// and `thetad validate`: 0). What reads the inputs (make_model, make_data, make_eval_tokens,
// check_token_inputs) takes this job; everything else reads the job as given (its fingerprint,
// compared across ranks, holds the paths as written).
config::Job with_input_paths(const config::Job& job, int rank);

}  // namespace thetad::daemon
