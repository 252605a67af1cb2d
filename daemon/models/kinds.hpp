// The models and data sources of each kind, for make_model and make_data (internal to
// daemon/models/ and daemon/data/): each kind's file builds its own (models.cpp: multitask_mlp
// and multitask_adapter and their synthetic data; extreme_classifier.cpp; script_model.cpp:
// torchscript; transformer.cpp; daemon/data/npy_data.cpp, daemon/data/token_data.cpp), and what
// several of them share.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "config/job.hpp"
#include "daemon/models/model.hpp"
#include "daemon/models/param_builder.hpp"
#include "daemon/ops/trunk_layer.hpp"

namespace thetad::daemon {

struct Placement;  // daemon/plan/placement.hpp

// model.kind: torchscript (model.path as given: expanded by the caller).
std::unique_ptr<TaskModel> make_script_model(const config::Job& job, torch::Device device);
// model.kind: extreme_classifier, and its synthetic data (data.kind: synthetic).
std::unique_ptr<TaskModel> make_extreme_classifier(const config::Job& job, const Placement& place, torch::Device device,
                                                   bool lazy_tasks);
std::unique_ptr<DataSource> make_synthetic_classes(const config::Job& job, torch::Device device);
// data.kind: npy (npy_data.cpp).
std::unique_ptr<DataSource> make_npy_data(const config::Job& job, const TaskModel& model, torch::Device device);

namespace detail {
// Runs Linear+GELU layers through trunk_layer (layer i = index i of `layers`): the multitask MLP's
// trunk and the extreme classifier's encoder.
torch::Tensor run_trunk(const std::vector<Linear>& layers, torch::Tensor h, LayerWeights* weights,
                        ActivationStash* stash);
}  // namespace detail

}  // namespace thetad::daemon
