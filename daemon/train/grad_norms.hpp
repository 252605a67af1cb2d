// The norm of a step's reduced gradient, per group, where the gradients already are: after the
// allreduce (every rank holds the reduced gradient of every group some rank trained), before the
// update. One fused norm kernel over the pieces (a bucket's flat buffer, or an adopted
// parameter's own gradient), queued on the compute stream; the host reads the pieces' norms a step
// later with the step's losses (StepRecorder), never waiting inside a step.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "comm/engine.hpp"

namespace thetad::daemon {

struct ParamGroups;  // daemon/models/param_groups.hpp

struct GradNormParts {
  torch::Tensor norms;     // float32 [pieces] on the device: each piece's L2 norm (undefined: none)
  std::vector<int> group;  // each piece's group
  std::vector<uint8_t> kept;  // per piece: its group's gradient was kept here (no other rank has it)
  bool whole = true;       // false: a trained group's gradient is never whole here (streamed)
};

// The pieces of every group with contributors[g] > 0, from the engine's gradient memory (`modes`:
// each group's, Homes::grad_memory). Groups without a gradient (a frozen base) have none. A group
// whose one trainer kept its gradient (Engine::keep) has pieces on that rank only: elsewhere its
// buffers were never reduced. `kept_only`: just those (a rank that writes no metrics sends their
// norms to rank 0 with its task losses).
GradNormParts grad_norm_parts(comm::Engine& engine, const ParamGroups& groups, const std::vector<comm::GradMemory>& modes,
                              const std::vector<int32_t>& contributors, torch::Device device, bool kept_only);

}  // namespace thetad::daemon
