// Bounds of a job that config/ enforces and daemon/ relies on: far beyond any real job, they
// keep the schedule's per-step vectors (one entry per group or draw) small.
#pragma once

#include <cstdint>

namespace thetad::config {

constexpr int64_t kMaxTasks = int64_t{1} << 20;         // model.tasks
constexpr int64_t kMaxTasksPerRank = int64_t{1} << 16;  // data.tasks_per_rank (round_robin, weighted)

}  // namespace thetad::config
