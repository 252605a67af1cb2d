// A job's outputs kept out of its inputs, checked before anything starts (thetad validate, and
// every run): a merged model written into its base's directory replaced the base's
// model.safetensors and config.json, and an adapter exported into lora.init_from's directory
// replaced what the next resume starts from.
#pragma once

#include "config/job.hpp"

namespace thetad::daemon {

// Every path a run of `world` ranks writes (export.adapters_dir and export.merged_dir per task,
// checkpoint.dir, metrics.path, log.file, timeline.path), resolved as far as it exists (symbolic
// links followed, "." and ".." folded), against every input it reads (model.init_from,
// lora.init_from per task, data.dir, eval.dir, model.path, {rank} for each rank): an output that
// is an input, or lies inside an input directory, is a ConfigError naming both keys and the path.
// An input inside an output directory is allowed (a checkpoint directory beside the data).
void check_outputs_apart(const config::Job& job, int world);

}  // namespace thetad::daemon
