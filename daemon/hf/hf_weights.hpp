// model.init_from from safetensors: a .safetensors file or a Hugging Face model directory
// (model.safetensors, or shards with model.safetensors.index.json), memory-mapped.
#pragma once

#include <string>

#include <memory>

#include "config/job.hpp"
#include "daemon/formats/safetensors.hpp"
#include "daemon/models/model.hpp"

namespace thetad::daemon {

// True for a path load_safetensors_weights reads (a directory, or a name ending .safetensors).
bool is_safetensors_source(const std::string& path);

// Every shared parameter (group 0) from the checkpoint, under thetad's name or its Hugging Face
// name (model.layers.N.self_attn.q_proj.weight -> blocks.N.attn.q.weight, ...); task parameters
// where present under thetad's names. F32, BF16 and F16 become float32. A missing shared
// parameter, a shape that differs, a dtype that is not floating point, or two tensors naming one
// parameter is a ConfigError naming the file and the tensor; tensors that name no parameter are
// listed in a warning. Lazily built task parameters get an init that reads the file.
void load_safetensors_weights(const config::Job& job, TaskModel& model);

// Gives `p` the values of the checkpoint's tensor `name` (F32, BF16 or F16 of p's shape, else a
// ConfigError naming the file, the tensor and `what`): now, or for a lazily built task parameter
// through p.init, which reads the map when the host store fills it.
void assign_from(const std::shared_ptr<const SafetensorsCheckpoint>& ck, const std::string& name, NamedParam& p,
                 const std::string& what);

}  // namespace thetad::daemon
