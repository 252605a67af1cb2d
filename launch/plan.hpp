// What the launcher will run: the job checked in-process with thetad's loader, its name and log
// directory, the number of ranks and nodes, and the mpirun or srun command line with the
// environment the ranks get. Every refusal happens here, before anything starts.
#pragma once

#include <string>
#include <vector>

#include "launch/options.hpp"

namespace thetad::launch {

struct Plan {
  std::string self;       // this program (the ranks' wrapper: `self --worker ...`)
  std::string thetad;
  std::string job;        // absolute path of the job file
  std::string job_text;   // its bytes as checked: the ranks read these (checked_copy), not the file again
  std::string checked_copy;  // where they are, in the log dir ("" on a dry run: nothing starts)
  std::string job_name;   // the job's `job` key after --set
  std::string log_dir;    // absolute
  std::string launcher;   // "mpirun" or "srun"
  int nproc = 1;          // ranks per node
  int ranks = 1;
  int nodes = 1;
  int gpus = 0;           // GPUs visible here
  bool host_list = false; // --hosts or --hostfile
  bool simulated = false; // simulated nodes (THETAD_SIMULATE_NODES)
  std::vector<std::string> validate_note;  // what the dry run prints for the check
  std::vector<std::string> command;        // mpirun/srun ... self --worker LOGDIR -- thetad run ...
};

// Checks everything and builds the plan; sets the variables the ranks inherit (OMP_NUM_THREADS,
// THETAD_SIMULATE_NODES, ...) in this process's environment. Throws thetad::Error with the exit
// code of exit_code_for: ConfigError (2) for bad input, Error (1) for a missing program.
Plan make_plan(const Options& o);

// mpirun's network flags when THETAD_MPIRUN_ARGS does not replace them: `one_host` (no host
// list) keeps the ranks on shared memory, no TCP BTL; a host list on a `loopback_only` machine
// uses TCP on lo; a host list with a network gets none (docs/deploy.md, Security).
std::vector<std::string> mpirun_network_flags(bool one_host, bool loopback_only);

// GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else `nvidia-smi -L`'s count.
int count_gpus();
// The ids of CUDA_VISIBLE_DEVICES (or 0..count-1 when unset).
std::vector<std::string> visible_gpu_ids(int count);

// A command line for people: words quoted only where they need it.
std::string shell_words(const std::vector<std::string>& words);

}  // namespace thetad::launch
