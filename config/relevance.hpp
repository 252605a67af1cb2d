// Internal to config/: keys given in a job that have no effect under the job's choices (a
// model kind's keys under another kind, a schedule's keys under another schedule, offload keys
// with offload off, ...). Not errors (a job file may be shared between variants), but a likely
// mistake, so each is a warning naming file:line:key and why it is ignored.
#pragma once

#include "config/diagnostics.hpp"
#include "config/job.hpp"

namespace thetad::config::detail {

void warn_irrelevant(const Job& job, Diagnostics& diag);

}  // namespace thetad::config::detail
