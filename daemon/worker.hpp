// `thetad run`: the worker of one rank. Torch-free header so the CLI stays a light translation
// unit; the implementation (worker.cpp) is the training loop over LibTorch.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "config/job.hpp"

namespace thetad::daemon {

struct RunOptions {
  bool resume = true;  // resume from the newest complete checkpoint in checkpoint.dir
};

// Set by the SIGTERM/SIGINT handler; the worker agrees with the other ranks at the end of each
// step, checkpoints and returns kExitInterrupted.
extern std::atomic<int> g_stop_signal;

// Runs the job on this rank inside an initialized MPI session. Returns the exit code; throws
// thetad::Error subclasses on failure.
int run_worker(const config::Job& job, const RunOptions& opts);

// Learning rate at `step` (0-based) with linear warmup and optional cosine decay.
double lr_at(const config::OptimizerConfig& opt, int64_t step, int64_t total_steps);

}  // namespace thetad::daemon
