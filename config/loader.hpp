// Loading a job: YAML file + `--set key.path=value` overrides -> validated Job.
// All problems are collected and reported together; each names file, line, column and key.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "config/job.hpp"
#include "config/load_options.hpp"
#include "config/param_counts.hpp"  // param_counts, for the loader's users

namespace thetad::config {

// Thrown by load_job when the job is invalid; what() is all messages, one per line.
class JobError : public ConfigError {
 public:
  explicit JobError(std::vector<std::string> messages);
  const std::vector<std::string>& messages() const { return messages_; }

 private:
  std::vector<std::string> messages_;
};

// The largest job file load_job reads.
constexpr size_t kMaxJobFileBytes = size_t{1} << 20;

// A job file's bytes (a regular file of at most kMaxJobFileBytes); JobError (exit 2) otherwise.
std::string read_job_file(const std::string& path);

// Reads, overrides, validates. Throws JobError (exit 2) listing every problem.
Job load_job(const std::string& path, const LoadOptions& opts = {});

// Same, from YAML text (`source` names it in messages).
Job load_job_from_string(const std::string& yaml, const std::string& source,
                         const LoadOptions& opts = {});

// The effective configuration as YAML (every key, defaults included), for `thetad validate`.
std::string to_yaml(const Job& job);

// A canonical text of the job's settings that must agree across ranks (used for the startup
// hash check); excludes per-rank things such as log file paths.
std::string fingerprint(const Job& job);

// The checks that need the number of ranks, known only when the job runs (before any step):
// schedule per_rank needs one task list per rank, and with more than one rank timeline.path
// and log.file need {rank}. Throws JobError naming the job file and the key.
void check_world(const Job& job, int world_size);

// A path key's value with {job} and {rank} expanded (config/placeholders.hpp: in one pass).
std::string expand_path(const std::string& path, const Job& job, int rank);

// checkpoint.dir with {job} expanded: one directory for every rank, which each rank writes its
// share into and reads whole at resume (validation refuses {rank} in it); "" without checkpoints.
std::string checkpoint_dir(const Job& job);

}  // namespace thetad::config
