// The transformer workload (model.kind: transformer): a decoder-only language model whose base is
// Θ and whose per-task LoRA adapters are θ[t], and the token data it trains on.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "config/job.hpp"
#include "daemon/models/model.hpp"

namespace thetad::daemon {

struct Placement;  // daemon/plan/placement.hpp

// Pre-norm blocks, every weight matrix without bias, the output layer tied to the token embedding
// or not (model.tie_embeddings). model.arch gpt2: LayerNorm, causal multi-head self-attention,
// GELU MLP, learned positions. llama (Hugging Face's LlamaForCausalLM, same names through
// daemon/formats/hf_names.hpp): RMSNorm, rotary positions (model.rope_theta), grouped-query
// attention (model.kv_heads), SwiGLU MLP (gate, up, down). LoRA adapters of rank lora.rank on
// lora.targets (q, k, v, o, gate, up, down) per task: W x + (alpha / rank) B A x, with B zero at
// the start (the adapted model starts as the base). Task parameters are placeholders with
// `lazy_tasks` (the host store draws them).
std::unique_ptr<TaskModel> make_transformer(const config::Job& job, const Placement& place, torch::Device device,
                                            bool lazy_tasks);

// Windows of seq_len + 1 tokens per row (inputs and next-token targets, int64 [rows, seq_len]):
// synthetic (each task a walk through the vocabulary with a stride of its own, with
// data.noise of the tokens replaced at random) or read from data.dir/task{t}.npy (1-D int64,
// int32 or uint16 token ids) or, with data.token_dtype uint16 or uint32, from the flat files
// data.dir/task{t}.bin; memory-mapped, checked before any step (daemon/data/token_data.cpp).
std::unique_ptr<DataSource> make_token_data(const config::Job& job, torch::Device device);

}  // namespace thetad::daemon
