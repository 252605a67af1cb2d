// Bounds of a job that config/ enforces and daemon/ relies on: far beyond any real job, they
// keep the schedule's per-step vectors (one entry per group or draw) small.
#pragma once

#include <cstddef>
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

// The values one job document (or one `--set`) may expand to: YAML aliases (*name) repeat the
// node they name, so 600 KB of text can stand for 150 million values. Written out, every value
// takes a byte of the text at least ("0," two), so a text of N bytes without aliases never holds
// more than N; aliases may repeat up to that (and up to kMinJobValues in a short text), never
// past kMaxJobValues.
constexpr size_t kMinJobValues = size_t{1} << 16;
constexpr size_t kMaxJobValues = size_t{1} << 20;
inline size_t job_value_bound(size_t text_bytes) {
  return text_bytes < kMinJobValues ? kMinJobValues : text_bytes > kMaxJobValues ? kMaxJobValues : text_bytes;
}
// The errors one load reports; the rest are counted (a file of a million bad values is one mistake).
constexpr size_t kMaxJobErrors = 100;

// comm.bucket_cap_mb, comm.first_bucket_mb: a bucket holds at least one fp32 element.
constexpr double kMinBucketBytes = 4;

}  // namespace thetad::config
