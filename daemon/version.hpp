// What `thetad version` prints: thetad's version and commit, and the library versions compiled in.
#pragma once

#include <string>

namespace thetad {
std::string version_text();
bool torch_has_cuda();  // built against a CUDA LibTorch (device tensors available)
}  // namespace thetad
