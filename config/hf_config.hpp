// A Hugging Face config.json next to model.init_from: the Llama keys it sets become the
// job's model keys where the job does not give them, and are checked where it does.
#pragma once

#include "config/diagnostics.hpp"
#include "config/job.hpp"

namespace thetad::config::detail {

// For model.kind transformer with model.init_from a directory (its config.json is required) or a
// file with a config.json beside it: model_type must be llama; hidden_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, rope_theta,
// rms_norm_eps and tie_word_embeddings fill model.d_model, layers, heads, kv_heads, d_ff, vocab,
// rope_theta, norm_eps and tie_embeddings (model.arch becomes llama). A key the job gives with
// another value is an error naming the key, the file and both values; so is a config this
// transformer cannot compute (biases, another activation, rope_scaling, seq_len beyond
// max_position_embeddings). Does nothing when init_from does not exist (validation reports it).
void apply_hf_config(Job& job, Diagnostics& diag);

}  // namespace thetad::config::detail
