// `thetad run`: the trainer of one rank. Torch-free header so the program's CLI stays a light
// translation unit; the step loop (trainer.cpp) runs over LibTorch.
#pragma once

#include "config/job.hpp"

namespace thetad::daemon {

struct RunOptions {
  bool resume = true;  // resume from the newest complete checkpoint in checkpoint.dir
};

// Runs the job on this rank inside an initialized MPI session. Returns the exit code; throws
// thetad::Error subclasses on failure.
int run_worker(const config::Job& job, const RunOptions& opts);

}  // namespace thetad::daemon
