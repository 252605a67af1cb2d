// A built-in model's parameter counts, as validation finds them from the job's keys: what the
// memory estimates and validation's own size checks read. Apart from loader.hpp so that the
// checks (checker.hpp, validate*.cpp) need nothing of the loader, which runs them.
#pragma once

#include "config/job.hpp"

namespace thetad::config {

// A built-in model's parameter counts (elements), found from its keys as validation finds them
// (config/validate_model.cpp; nothing allocated): Θ, the largest θ[t] and every θ[t] together.
// `known` is false for torchscript, and where a key is out of its range.
struct ParamCounts {
  bool known = false;
  double shared = 0, per_task = 0, tasks_total = 0;
};
ParamCounts param_counts(const Job& job);

}  // namespace thetad::config
