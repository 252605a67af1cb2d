// The launcher's command line: `thetad-launch [options] [--] JOB.yaml [thetad run options]`.
// Parsing only; bad input throws thetad::ConfigError (exit 2) with one line naming the option.
#pragma once

#include <string>
#include <vector>

namespace thetad::launch {

struct Options {
  std::string nproc;       // --nproc-per-node, as given ("" = default)
  std::string hostfile;
  std::string hosts;
  std::string thetad;
  std::string log_dir;
  std::string launcher = "auto";
  std::string simulate_nodes;
  bool dry_run = false;
  bool help = false;
  std::string job;                     // JOB.yaml as given
  std::vector<std::string> run_args;   // everything after JOB.yaml, for `thetad run`
  std::vector<std::string> overrides;  // the --set key=value among run_args
};

// Throws ConfigError for an unknown option, a missing value, a bad --log-level.
Options parse_options(int argc, char** argv);

const char* usage_text();

}  // namespace thetad::launch
