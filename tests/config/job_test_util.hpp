// Shared by the config tests: the smallest valid job and the error text of loading one.
#pragma once

#include <string>

#include "config/loader.hpp"

namespace thetad::config::test {

inline const std::string kMinimal =
    "steps: 10\n"
    "model: {kind: multitask_mlp}\n"
    "data: {}\n";

// load_job_from_string's error text ("job.yaml" names the source), or "(accepted)".
inline std::string error_of(const std::string& yaml, const LoadOptions& opts = {}) {
  try {
    load_job_from_string(yaml, "job.yaml", opts);
  } catch (const JobError& e) {
    return e.what();
  }
  return "(accepted)";
}

inline bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

}  // namespace thetad::config::test
