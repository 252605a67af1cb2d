// The transformer workload (model.kind: transformer): a decoder-only language model whose base is
// Θ and whose per-task LoRA adapters are θ[t], and the token data it trains on.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "config/job.hpp"
#include "daemon/models/model.hpp"

namespace thetad::daemon {

// Pre-norm blocks (LayerNorm, causal multi-head self-attention, LayerNorm, GELU MLP), learned
// positions, an untied output layer; every weight matrix without bias. LoRA adapters of rank
// lora.rank on lora.targets (q, k, v, o, up, down) per task: W x + (alpha / rank) B A x, with B
// zero at the start (the adapted model starts as the base). Task parameters are placeholders
// with `lazy_tasks` (the host store draws them).
std::unique_ptr<TaskModel> make_transformer(const config::Job& job, torch::Device device, bool lazy_tasks);

// Windows of seq_len + 1 tokens per row (inputs and next-token targets, int64 [rows, seq_len]):
// synthetic (each task a walk through the vocabulary with a stride of its own, with
// data.noise of the tokens replaced at random) or read from data.dir/task{t}.npy (1-D int64,
// int32 or uint16 token ids, memory-mapped, checked before any step).
std::unique_ptr<DataSource> make_token_data(const config::Job& job, torch::Device device);

}  // namespace thetad::daemon
