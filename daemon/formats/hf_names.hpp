// The names Hugging Face Llama, Mistral, Qwen2 and Qwen3 checkpoints and PEFT adapters give the
// base parameters of thetad's llama-family transformer (daemon/models/transformer.cpp), both ways.
// Torch-free: plain string work.
#pragma once

#include <string>

namespace thetad::daemon {

// "model.layers.3.self_attn.q_proj.weight" -> "blocks.3.attn.q.weight" (q_proj.bias ->
// attn.q.bias, self_attn.q_norm.weight -> attn.q_norm.weight); "" for a name that is not a
// parameter of the transformer (e.g. rotary_emb.inv_freq of older checkpoints).
std::string thetad_name_of_hf(const std::string& hf);
// The inverse: "blocks.3.mlp.gate.weight" -> "model.layers.3.mlp.gate_proj.weight"; "" if none.
std::string hf_name_of_thetad(const std::string& name);
// (The adapters' names, thetad's and PEFT's: config/lora_adapter.hpp.)

}  // namespace thetad::daemon
