// A Hugging Face config.json next to model.init_from: the keys of a Llama, Mistral, Qwen2 or Qwen3
// model that it sets become the job's model keys where the job does not give them, and are checked
// where it does.
#pragma once

#include <string>

#include "config/diagnostics.hpp"
#include "config/job.hpp"

namespace thetad::config {

// The config.json that describes model.init_from: in it where it is a directory, else beside it.
std::string hf_config_file(const std::string& init_from);

}  // namespace thetad::config

namespace thetad::config::detail {

// For model.kind transformer with model.init_from a directory (its config.json is required) or a
// file with a config.json beside it: model_type (llama, mistral, qwen2 or qwen3; absent: llama)
// sets model.arch; hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
// head_dim, intermediate_size, vocab_size, rms_norm_eps and tie_word_embeddings fill model.d_model,
// layers, heads, kv_heads, head_dim, d_ff, vocab, norm_eps and tie_embeddings; rope_theta and
// rope_scaling (or transformers 5's rope_parameters, which hold both) fill model.rope_theta and,
// for rope_type llama3, model.rope_scaling, rope_factor, rope_low_freq_factor,
// rope_high_freq_factor and rope_original_max_positions. A key the job gives with another value is
// an error naming the key, the file and both values; so is a config this transformer cannot
// compute (another model_type, biases other than Qwen2's, another activation, a rope type other
// than default and llama3, seq_len beyond max_position_embeddings or beyond a sliding window in
// use). Does nothing when init_from does not exist (validation reports it).
void apply_hf_config(Job& job, Diagnostics& diag);

}  // namespace thetad::config::detail
