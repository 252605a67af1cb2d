// Softmax cross-entropy over an output layer streamed in row chunks (the extreme classifier's
// sharded slices): the layer is one [rows x (hidden+1)] matrix W with the bias as its last
// column, so logits = h' W^T with h' = [h, 1]. Neither pass holds more than two chunks of W nor
// the full [batch x rows] logits.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "daemon/models/model.hpp"

namespace thetad::daemon {

// A source over resident matrices (one per task) in chunks of chunk_rows rows: the model's own
// parameters when nothing is offloaded, chunked exactly as the store shards them.
class ResidentChunks : public ShardSource {
 public:
  ResidentChunks() = default;
  ResidentChunks(std::vector<torch::Tensor> mats, int64_t chunk_rows);
  int num_chunks(int task) override;
  torch::Tensor chunk(int task, int k) override;
  void done(int task, int k) override {
    (void)task;
    (void)k;
  }

 private:
  std::vector<torch::Tensor> mats_;
  int64_t chunk_rows_ = 1;
};

// Mean over the batch of -log softmax(h' W^T)[y] for the task's matrix W read from `source`.
// Forward streams the chunks once (online log-sum-exp per row, the target's logit); backward
// streams them again in reverse order (the last chunks are the ones still on the device),
// recomputes each chunk's logits and adds dW_k = dlogits_k^T h' into rows of weight's .grad
// (created as zeros when undefined) and dlogits_k W_k into dh'. `weight` is the parameter the
// chunks are rows of: it gives the autograd edge and the gradient's home; its data is only read
// through the source. It receives no returned gradient: its AccumulateGrad still runs (with an
// undefined gradient), so post hooks on it (the engine's mark_ready) fire after the rows are
// written. y: [batch] int64 class indices in [0, rows).
torch::Tensor chunked_softmax_xent(const torch::Tensor& h, const torch::Tensor& weight,
                                   const torch::Tensor& y, ShardSource& source, int task);

// The same over a subset of the rows (sampled softmax): `classes` is sorted, unique, int64 row
// indices that include every label in y; the softmax runs over those rows only, and only their
// rows of .grad are written. Chunks stream as above (a chunk without a class is skipped).
torch::Tensor chunked_sampled_softmax_xent(const torch::Tensor& h, const torch::Tensor& weight,
                                           const torch::Tensor& y, const torch::Tensor& classes,
                                           ShardSource& source, int task);

// Logits h' W^T computed chunk by chunk, without gradient (evaluation; training uses the loss).
torch::Tensor chunked_logits(const torch::Tensor& h, ShardSource& source, int task);

}  // namespace thetad::daemon
