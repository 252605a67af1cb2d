// Cross-entropy of logits that keeps, for backward, its gradient instead of its probabilities
// (the language models' next-token loss: logits of [tokens, vocab] are the largest tensors of a
// step). Forward computes each chunk of rows' loss and d loss / d logits at once; backward only
// scales that gradient. linear_cross_entropy goes one step further for an output layer that
// needs no gradient: not even the logits exist whole.
#pragma once

#include <torch/torch.h>

namespace thetad::daemon {

// Mean over the rows of -log softmax(logits)[target], logits [rows, classes] in any float dtype,
// targets int64 [rows]. Numerically what cross_entropy on the logits widened to float32 gives;
// for backward it saves one tensor of the logits' shape and dtype (bf16 under autocast) holding
// (softmax - onehot) / rows, where the unfused loss saves float32 log-probabilities and, in
// backward, makes two more float32 tensors of that size. Rows are processed in chunks of at
// most ~64 MiB of float32, whole GEMM row tiles, so that no float32 copy of all the logits ever exists
// (`rows_per_chunk` > 0 sets the chunk instead: the tests).
// `masked`: a target below 0 is left out (a prompt token under data.loss_mask): its row adds
// nothing to the loss or its gradient, and the loss is the mean over the other rows (0 where
// there are none). Their count is taken on the device, so a masked loss costs no host sync; the
// rows' gradients are scaled by it in the one pass backward makes anyway.
torch::Tensor fused_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, int64_t rows_per_chunk = 0,
                                  bool masked = false);

// The same loss of logits = hidden weight^T (hidden [rows, d], weight [classes, d]: a language
// model's output layer) where the weight needs no gradient (a frozen base's head or tied
// embedding): each chunk's logits are made, turned into the loss and its gradient, and multiplied
// back through the weight at once, so that neither the logits nor their gradient ever exist
// whole. It keeps one tensor of the hidden states' shape for backward (the gradient that reaches
// them), where the unfused path keeps the logits-sized gradient: for 4,096 tokens of a 32,000
// vocabulary 33.5 MB against 524 MB in float32, and the logits themselves are never held at
// once. The matmuls run in what autocast gives them, as the unfused ones do, so the loss has the
// same value; the gradient differs from the unfused one only by rounding (its rows' GEMMs run in
// chunks, and a scaled loss scales the product instead of its factor). A weight that needs a
// gradient takes the unfused path. `masked` as fused_cross_entropy's: the chunks are the same,
// and the gradient of the hidden states (a tensor of their shape, not the logits') is scaled
// once by the counted rows. With no gradient wanted (evaluation: grad mode off, or nothing
// requiring one) both compute the loss alone, chunk by chunk: no gradient GEMM.
torch::Tensor linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                   const torch::Tensor& targets, int64_t rows_per_chunk = 0, bool masked = false);

}  // namespace thetad::daemon
