// The transformer's feed-forward activation, gelu(u) (gpt2) or silu(gate) * up (llama, SwiGLU),
// as an autograd function whose saved inputs may live in the activation stash
// (offload.activations): they are the largest tensors a block keeps for backward (d_ff wide).
// Its backward repeats LibTorch's derivative formulas op for op, so the gradients have the same
// bits as autograd's of the plain expressions, with or without the stash.
#pragma once

#include <torch/torch.h>

#include "daemon/ops/trunk_layer.hpp"

namespace thetad::daemon {

// gelu(up) where `gate` is undefined; silu(gate) * up otherwise. `layer`: the block, the stash's
// unit (null stash: autograd's own saving on the device). Without anything to differentiate it
// is the plain expression.
torch::Tensor ffn_activation(const torch::Tensor& gate, const torch::Tensor& up, int layer, ActivationStash* stash);

}  // namespace thetad::daemon
