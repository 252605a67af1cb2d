// Bounds of a job that config/ enforces and daemon/ relies on: far beyond any real job, they
// keep the schedule's per-step vectors (one entry per group or draw) small.
#pragma once

#include <cstdint>

namespace thetad::config {

constexpr int64_t kMaxTasks = int64_t{1} << 20;         // model.tasks
constexpr int64_t kMaxTasksPerRank = int64_t{1} << 16;  // data.tasks_per_rank (round_robin, weighted)
constexpr int64_t kMaxAccumulateSteps = int64_t{1} << 20;  // accumulate_steps (and steps x it < 2^63)
constexpr int64_t kMaxPrefetch = 1024;                   // offload.prefetch: steps planned ahead
constexpr int64_t kMaxCpuThreads = 4096;                 // offload.cpu_threads: threads of one rank

// Built-in models (multitask_mlp, multitask_adapter, extreme_classifier): their parameter
// shapes follow from the model keys, so validate bounds them before anything is allocated.
constexpr double kMaxTensorElems = double(int64_t{1} << 34);  // one parameter: 64 GiB of fp32
constexpr double kMaxModelParams = double(int64_t{1} << 38);  // all of them: 1 TiB of fp32

// comm.bucket_cap_mb, comm.first_bucket_mb: a bucket holds at least one fp32 element.
constexpr double kMinBucketBytes = 4;

}  // namespace thetad::config
