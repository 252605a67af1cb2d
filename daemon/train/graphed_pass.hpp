// A fused pass replayed from a CUDA graph (train.cuda_graphs). The transformer over a frozen base
// spends its LoRA step in the host, not the device: ~40 operations per layer and pass go through
// LibTorch's dispatcher and autograd's engine, ~25 ms per pass of the 12-layer benchmark whatever
// its rows (1 task x 6 rows: 26 ms, x 16 rows: 30 ms, H200). Captured once per shape, forward and
// backward of a pass replay as one launch. The tasks' adapters are copied into slots before each
// replay (TaskModel::slot_pass), and their gradients leave the graph through GradHooks::deliver,
// as autograd's hooks would hand them over: the engine, the homes and the optimizer see nothing new.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "config/job.hpp"
#include "daemon/device/data_plane.hpp"
#include "daemon/models/model.hpp"
#include "daemon/models/param_groups.hpp"
#include "daemon/plan/placement.hpp"
#include "daemon/reducer/grad_hooks.hpp"

namespace thetad::daemon {

class GraphedPass {
 public:
  // `capture`: false runs the slot pass without a graph, every time (the CPU, where a test aid
  // shows the slots and the delivery give the plain pass's bits).
  GraphedPass(TaskModel& model, ParamGroups& groups, GradHooks& hooks, const DataPlane& data, bool capture);
  ~GraphedPass();
  GraphedPass(const GraphedPass&) = delete;
  GraphedPass& operator=(const GraphedPass&) = delete;

  // The pass of `in`, each part's loss weighted by weights[i] in the sum backward starts from,
  // where a slot pass of its shape exists (parts of equal rows, a model that has slots): each
  // part's loss (tensors of their own). Empty: the caller runs the pass itself. Call with
  // autocast as forward has it.
  std::vector<torch::Tensor> forward(const PassInputs& in, const std::vector<double>& weights);
  // The last forward's gradients to the hooks, parameter by parameter in backward's order;
  // `last`: the window's last pass (its gradients are read before any other pass runs).
  void backward(bool last);

  int captures() const { return captures_; }

 private:
  struct Shape;
  void run(Shape& s, const std::vector<double>& weights);
  void capture(Shape& s, const std::vector<double>& weights);
  const std::vector<int>& slot_params(const Shape& s, int task);

  TaskModel& model_;
  ParamGroups& groups_;
  GradHooks& hooks_;
  const DataPlane& data_;
  const bool capture_;
  std::map<std::pair<int, int64_t>, std::unique_ptr<Shape>> shapes_;  // (parts, rows) -> its pass
  std::unordered_map<std::string, int> param_of_;                     // name -> parameter index
  std::unordered_map<int, std::vector<int>> slot_params_;             // task -> its parameter per slot
  Shape* last_ = nullptr;
  std::vector<int> last_tasks_;
  int captures_ = 0;
};

// The GraphedPass a job runs with, or nullptr: train.cuda_graphs on a GPU and a CUDA LibTorch
// 2.x, with groups declared (discovery walks autograd's graph, which a replay has none of), no
// activation offload (its copies are ordered by the host) and Θ resident. On the CPU only the
// test aid THETAD_TEST_SLOT_PASS gives one (without a graph).
std::unique_ptr<GraphedPass> make_graphed_pass(const config::Job& job, const Placement& placement, TaskModel& model,
                                               ParamGroups& groups, GradHooks& hooks, const DataPlane& data);

}  // namespace thetad::daemon
