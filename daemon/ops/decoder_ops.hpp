// The transformer's math that holds no parameter of its own: the blocks' norms, the heads' norms
// (Qwen3) and causal attention, over the tensors daemon/models/transformer.cpp hands them.
#pragma once

#include <torch/torch.h>

#include "daemon/ops/rotary.hpp"

namespace thetad::daemon {

// In float32 whatever the compute dtype (as autocast does on GPUs, and as Hugging Face's
// LlamaRMSNorm does): LayerNorm with weight w and bias b (gpt2), or with `rms` RMSNorm
// x / sqrt(mean(x^2) + eps) * w (llama).
torch::Tensor block_norm(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& b, bool rms, double eps);

// Hugging Face's RMSNorm of each head of x [rows, seq, heads x head_size] with weight w
// [head_size], in float32.
torch::Tensor head_rms_norm(const torch::Tensor& x, const torch::Tensor& w, int64_t head_size, double eps);

// Causal attention over [rows, seq, heads x head_size] queries and [rows, seq, kv_heads x
// head_size] keys and values (any strides of whole heads: views of a joined GEMM's output),
// each key/value head shared by heads / kv_heads queries, with rotary positions where `rotary`
// is given (llama). Rows are independent sequences: a fused pass takes its tasks' rows at once.
// [rows, seq, heads x head_size].
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t heads,
                               int64_t kv_heads, int64_t head_size, const RotaryTables* rotary);

}  // namespace thetad::daemon
