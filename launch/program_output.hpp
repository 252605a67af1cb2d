// Runs a short helper program (nvidia-smi) to its end and returns what it printed on stdout.
#pragma once

#include <string>
#include <vector>

namespace thetad::launch {

// stdout of `argv` ("" when it cannot start); its stderr is discarded. The helper is killed
// when this process ends (PR_SET_PDEATHSIG).
std::string program_output(const std::vector<std::string>& argv);

}  // namespace thetad::launch
