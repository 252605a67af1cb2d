// The names Hugging Face Llama, Mistral, Qwen2 and Qwen3 checkpoints and PEFT adapters give the
// parameters of thetad's llama-family transformer (daemon/models/transformer.cpp), both ways.
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

// The module a LoRA target adapts: "q" -> "q_proj" (PEFT's target_modules words); "" if none.
std::string hf_module_of_target(const std::string& target);
// PEFT's tensor name of a layer's adapter matrix: A ([rank, in]) or B ([out, rank]), e.g.
// "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight".
std::string peft_lora_name(long layer, const std::string& target, bool a);

}  // namespace thetad::daemon
