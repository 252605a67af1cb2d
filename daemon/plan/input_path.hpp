// The paths of a job's inputs (data.dir, model.path) as this process reads them: the placeholders
// {job} and {rank} expanded once this process's rank is known, by the one expansion of every path
// (config::expand_path, config/placeholders.hpp).
#pragma once

#include <string>

#include "config/job.hpp"

namespace thetad::daemon {

// `path` with {job} and {rank} replaced (rank: this process's in MPI_COMM_WORLD; 0 outside MPI,
// as in the single-process reference).
std::string input_path(const std::string& path, const config::Job& job);

}  // namespace thetad::daemon
