// model.init_from: starting a model from weights the user has (fine-tuning a base). Declared
// here, for make_model; defined with the file readers it uses in daemon/hf/initial_weights.cpp.
#pragma once

#include "config/job.hpp"
#include "daemon/models/model.hpp"

namespace thetad::daemon {

// Overwrites the model's initial parameters with those of job.model.init_from: safetensors (a
// .safetensors file or a Hugging Face directory: hf_weights.hpp), or a file written by
// torch.save (or torch::pickle_save) of a dict {parameter name: tensor} (a state dict), or a
// group file of thetad's checkpoint format 2 (keys "param/NAME"; the optimizer's keys ignored).
// Every shared parameter (group 0) must be in the file; task parameters may be (those not in it
// keep their initialization). A key that names no parameter, a tensor of another shape, or a
// missing shared parameter is a ConfigError naming the file and the key, and so is a NaN or an
// infinity. The file is read by thetad's strict reader (pt_dict.hpp), never LibTorch's unpickler.
// Tensors are converted to float32. Lazily built task parameters (the host store) get an init that
// copies the file's values.
// Then the adapters of lora.init_from (peft_adapters.hpp).
void load_initial_weights(const config::Job& job, TaskModel& model);

}  // namespace thetad::daemon
