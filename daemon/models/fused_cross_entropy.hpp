// Cross-entropy of logits that keeps, for backward, its gradient instead of its probabilities
// (the language models' next-token loss: logits of [tokens, vocab] are the largest tensors of a
// step). Forward computes each chunk of rows' loss and d loss / d logits at once; backward only
// scales that gradient.
#pragma once

#include <torch/torch.h>

namespace thetad::daemon {

// Mean over the rows of -log softmax(logits)[target], logits [rows, classes] in any float dtype,
// targets int64 [rows]. Numerically what cross_entropy on the logits widened to float32 gives;
// for backward it saves one tensor of the logits' shape and dtype (bf16 under autocast) holding
// (softmax - onehot) / rows, where the unfused loss saves float32 log-probabilities and, in
// backward, makes two more float32 tensors of that size. Rows are processed in chunks of at
// most ~64 MiB of float32 so that no float32 copy of all the logits ever exists
// (`rows_per_chunk` > 0 sets the chunk instead: the tests).
torch::Tensor fused_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, int64_t rows_per_chunk = 0);

}  // namespace thetad::daemon
