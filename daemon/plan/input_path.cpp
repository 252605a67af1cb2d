// Input paths with their placeholders expanded (see input_path.hpp).
#include "daemon/plan/input_path.hpp"

#include "config/loader.hpp"

namespace thetad::daemon {

config::Job with_input_paths(const config::Job& job, int rank) {
  config::Job out = job;
  out.data.dir = config::expand_path(job.data.dir, job, rank);
  out.model.path = config::expand_path(job.model.path, job, rank);
  out.eval.dir = config::expand_path(job.eval.dir, job, rank);
  return out;
}

}  // namespace thetad::daemon
