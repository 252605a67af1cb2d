// The compute precision of forward (job key `precision`). bf16 is mixed precision as autocast
// does it: matmuls and linear layers (and what follows them elementwise) run in bfloat16, while
// the parameters, their gradients, the optimizer state and the losses stay float32. Backward runs
// in the dtypes forward chose (autocast's casts are autograd nodes that widen the gradients back
// to float32 at the parameters). bf16 keeps float32's exponent range, so no loss scaling is needed.
#pragma once

#include <torch/torch.h>

#include <optional>

#include "config/job.hpp"

namespace thetad::daemon {

// Turns autocast to bf16 on for `device`'s type while it lives (no-op for fp32 and tf32), and
// restores the previous state afterwards. The cache of bf16 copies of the parameters is dropped
// when the outermost scope ends: the optimizer updates them between forwards. Thread-local, as
// autocast is: open it on the thread that runs forward; backward does not need it.
class AutocastScope {
 public:
  AutocastScope(config::Precision precision, const torch::Device& device);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool on_ = false;
  torch::DeviceType type_ = torch::kCPU;
  bool was_enabled_ = false;
  torch::ScalarType was_dtype_ = torch::kBFloat16;
};

// The dtype autocast casts matmul arguments to on `type` while it is on here (this thread), or
// nullopt: for functions that compute a linear layer themselves and must cast as autocast would.
std::optional<torch::ScalarType> active_autocast_dtype(torch::DeviceType type);

// A parameter's values as float32 on the host (a bf16-held base widened, exactly): what
// checkpoints, the final hash and GroupState read. Float32 tensors come back as they are.
torch::Tensor fp32_values(const torch::Tensor& t);

}  // namespace thetad::daemon
