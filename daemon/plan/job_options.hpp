// Where a job key becomes an option of the engine, the bucket plan, the host store or the
// optimizer: the one translation of config::Job into the torch-free libraries' options.
// The trainer adds what only it knows (streams, callbacks, per-group memory modes).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "comm/bucket_plan.hpp"
#include "comm/engine.hpp"
#include "config/job.hpp"
#include "offload/param_store.hpp"

namespace thetad::daemon {

// comm.timeout_s: every collective and every wait on another rank is bounded by it.
std::chrono::milliseconds comm_timeout(const config::Job& job);

comm::BucketPlanOptions bucket_plan_options(const config::Job& job);
// prune, average, declared/discover mode and the timeout.
comm::EngineOptions engine_options(const config::Job& job);
// Slots or budget, prefetch, host limit, CPU threads, shards and the timeout.
offload::StoreOptions store_options(const config::Job& job);

// Learning rate at `step` (0-based) with linear warmup and optional cosine decay.
double lr_at(const config::OptimizerConfig& opt, int64_t step, int64_t total_steps);

// The compatibility key of checkpoints: a hash of what fixes the parameters' names and shapes
// (the job's model.* keys), as 16 hex digits.
std::string model_hash(const config::Job& job);
std::string hex64(uint64_t h);

}  // namespace thetad::daemon
