// One trunk layer y = act(x W^T + b) as an autograd function whose two memories may live off
// the device: its weights (offload.shared: stream — fetched before forward and again before
// backward) and the tensors it saves for backward (offload.activations — pinned host buffers).
// Its backward gives the same bits as LibTorch's autograd of act(addmm(b, x, W^T)) on the CPU, in
// float32 and under bf16 autocast, so a model built on it trains bit for bit as before.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace thetad::daemon {

enum class TrunkAct { none, gelu };

// Where a streamed trunk's layer weights come from (null: the layer's own parameters, autograd leaves).
class LayerWeights {
 public:
  virtual ~LayerWeights() = default;
  // W [out x in] and b [out] of `layer` on the compute device, valid until release(layer).
  // `backward`: for the layer's backward (layers then come in reverse order; prefetch that way).
  virtual std::pair<torch::Tensor, torch::Tensor> acquire(int layer, bool backward) = 0;
  // Compute using the layer's weights is queued; its memory may be reused once that compute is done.
  virtual void release(int layer) = 0;
  // The layer's weight and bias gradients from this backward (the provider accumulates/reduces/moves them).
  virtual void grad(int layer, const torch::Tensor& dW, const torch::Tensor& db) = 0;
  // False when the layer's weights get no gradient in this backward (a frozen trunk): backward
  // then neither computes dW, db nor calls grad(). Asked at forward.
  virtual bool wants_grad(int layer) {
    (void)layer;
    return true;
  }
};

// Where the tensors a layer saves for backward live (null: on the device, as autograd keeps them).
class ActivationStash {
 public:
  virtual ~ActivationStash() = default;
  virtual int64_t put(int layer, std::vector<torch::Tensor> saved) = 0;   // forward
  virtual std::vector<torch::Tensor> take(int64_t ticket) = 0;            // backward (prefetches the next ticket in reverse order)
};

// Leaf W, b when `weights` is null (their gradients reach W.grad/b.grad through autograd as
// with torch::linear); otherwise W, b are ignored (undefined) and come from `weights`.
// Without anything to differentiate (grad mode off, or x, W, b needing no gradient and no
// `weights`) it is a plain forward: nothing is saved or stashed.
torch::Tensor trunk_layer(const torch::Tensor& x, const torch::Tensor& W, const torch::Tensor& b,
                          TrunkAct act, int layer, LayerWeights* weights, ActivationStash* stash);

}  // namespace thetad::daemon
