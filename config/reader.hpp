// Internal to config/: YAML text and `--set key.path=value` overrides -> Job fields, with
// type checks, unknown-key suggestions and the origin of every key recorded in Diagnostics.
#pragma once

#include <string>

#include "config/diagnostics.hpp"
#include "config/job.hpp"

namespace thetad::config::detail {

// Parses `text` and reads it into `job`. Returns false when the document itself is unusable
// (malformed YAML, not a map), in which case later validation would only add noise.
bool read_document(const std::string& text, Job& job, Diagnostics& diag);

// Applies one "key.path=value" override; the value is YAML ("[0.9, 0.99]", "{kind: npy}").
void apply_override(const std::string& assignment, Job& job, Diagnostics& diag);

}  // namespace thetad::config::detail
