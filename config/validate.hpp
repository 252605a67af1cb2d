// Internal to config/: the semantic checks of a parsed Job (ranges, enum values, settings that
// contradict each other or this build), reported through Diagnostics.
#pragma once

#include "config/diagnostics.hpp"
#include "config/job.hpp"
#include "config/load_options.hpp"

namespace thetad::config::detail {

void validate(const Job& job, const LoadOptions& opts, Diagnostics& diag);
// offload.shared and offload.shared_prefetch_layers (validate_offload.cpp; called by validate).
void validate_shared(const Job& job, Diagnostics& diag);

}  // namespace thetad::config::detail
