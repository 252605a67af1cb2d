// How a job is loaded: the `--set` overrides and what the binary was built with. Its own header so
// that validation (validate.hpp, checker.hpp) needs nothing of the loader that calls it.
#pragma once

#include <string>
#include <vector>

namespace thetad::config {

struct LoadOptions {
  std::vector<std::string> overrides;  // "key.path=value", applied after the file is read
  bool cuda_build = false;             // whether this binary was built with NCCL/CUDA
};

}  // namespace thetad::config
