// Gradient clipping's factor, shared by the resident optimizer (daemon/optim/optimizer.cpp) and the
// host store (offload/), so both scale by exactly the same double. Header-only, torch-free.
#pragma once

namespace thetad {

// The factor that brings a gradient of L2 norm `norm` down to `max_norm`: 1 when the norm is
// not above it. The 1e-6 keeps the division finite (torch.nn.utils.clip_grad_norm_'s formula).
inline double clip_factor(double norm, double max_norm) {
  return norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

}  // namespace thetad
