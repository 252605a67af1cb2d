// A PEFT adapter directory's adapter_config.json (lora.init_from) read and checked against the
// job, torch-free: a regular file of bounded size, not a link out of its directory, JSON nested
// boundedly, quoted in messages by short forms only.
#pragma once

#include <string>

#include "config/job.hpp"
#include "config/lora_adapter.hpp"

namespace thetad::daemon {

// PEFT's target_modules word of a target: q -> "q_proj", gate -> "gate_proj".
std::string peft_module_word(config::LoraTarget target);

// Checks `dir`/adapter_config.json: a LoRA (peft_type "LORA") of r = lora.rank, lora_alpha =
// lora.alpha and target_modules = lora.targets; rsLoRA, DoRA, biases, fan_in_fan_out and
// per-layer patterns refused. Any problem is a ConfigError "DIR/adapter_config.json:
// lora.init_from: ..." naming the key and both values.
void check_adapter_config(const std::string& dir, const config::Job& job);

// Every task's lora.init_from directory that exists ({task} expanded; one missing starts afresh):
// its adapter_config.json as above, and its adapter_model.safetensors a regular file within the
// directory. thetad validate and every rank of thetad run, before anything starts (the tensors are
// checked as the run maps and reads them).
void check_adapter_inputs(const config::Job& job);

}  // namespace thetad::daemon
