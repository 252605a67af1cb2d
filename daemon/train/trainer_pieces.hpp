// The Trainer: one rank's training, its pieces and their wiring (internal to daemon/train/). Its
// construction and wiring are in trainer_build.cpp, one step (forward, backward, the reduce, the
// optimizer step and the step's record) in trainer_step.cpp, and the step loop with its
// agreements and checkpoints in trainer.cpp.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "comm/bootstrap.hpp"
#include "comm/control_plane.hpp"
#include "comm/engine.hpp"
#include "common/stopwatch.hpp"
#include "config/job.hpp"
#include "daemon/device/data_plane.hpp"
#include "daemon/homes/homes.hpp"
#include "daemon/models/activation_stash.hpp"
#include "daemon/models/model.hpp"
#include "daemon/models/param_groups.hpp"
#include "daemon/observe/timeline.hpp"
#include "daemon/optim/optimizer.hpp"
#include "daemon/plan/input_path.hpp"
#include "daemon/plan/placement.hpp"
#include "daemon/plan/schedule.hpp"
#include "daemon/plan/window_plan.hpp"
#include "daemon/reducer/grad_hooks.hpp"
#include "daemon/state/run_state.hpp"
#include "daemon/train/evaluation.hpp"
#include "daemon/train/graphed_pass.hpp"
#include "daemon/train/memory_breakdown.hpp"
#include "daemon/train/step_protocol.hpp"
#include "daemon/train/step_record.hpp"
#include "daemon/train/trainer.hpp"

namespace thetad::daemon {

class Trainer {
 public:
  using Clock = SteadyClock;

  Trainer(const config::Job& job, const RunOptions& opts)
      : job_(job), opts_(opts), world_(comm::world_info()), inputs_(with_input_paths(job, world_.rank)) {}
  int run();

 private:
  void build();
  void build_model();
  void build_engine();
  void train_step(int64_t step, PendingStep& p);
  torch::Tensor forward(int64_t micro, const StepPlan& plan, size_t first, size_t end, PendingStep& p);
  int64_t resolve_tasks_per_pass() const;
  std::vector<std::pair<size_t, size_t>> task_passes(const StepPlan& plan) const;
  void backward(torch::Tensor& total, bool last, const StepPlan& plan, PendingStep& p);
  void finish_reduce(PendingStep& p);
  bool nonfinite(int64_t step, double loss, StepRecord& rec);
  void optimizer_step(int64_t step, PendingStep& p, bool skip);
  AdamSettings adam_settings(int64_t step) const;
  void record_engine_stats(StepRecord& rec);

  const config::Job& job_;
  const RunOptions opts_;
  const comm::WorldInfo world_;
  const config::Job inputs_;  // the job with this rank's input paths: what builds the model and data
  std::shared_ptr<comm::Communicator> ctrl_;  // control plane: agreements, checkpoints (MPI)
  std::unique_ptr<comm::ControlPlane> plane_;
  DataPlane data_;                            // device, gradients' communicator, compute stream
  Placement placement_;                       // where each group lives, decided once from the job
  std::unique_ptr<Timeline> timeline_;
  std::unique_ptr<TaskModel> model_;
  std::unique_ptr<DataSource> batches_;
  std::unique_ptr<Schedule> schedule_;
  // Each window's plan per rank, computed once from the schedule: this rank's is built at the
  // window's start and handed to every home; the store's look-ahead and the replica rule read
  // other ranks' and later windows' from it.
  std::unique_ptr<WindowPlans> plans_;
  std::unique_ptr<ParamGroups> groups_;
  std::unique_ptr<comm::Engine> engine_;
  // Where each group lives (device, host store, streamed). Destroyed before the engine: the
  // stores' copies may still read the engine's gradient memory until their streams are done.
  std::unique_ptr<Homes> homes_;
  std::unique_ptr<PooledActivationStash> act_stash_;  // offload.activations: the trunk's saved tensors
  std::unique_ptr<GradHooks> hooks_;
  std::unique_ptr<StepProtocol> protocol_;     // a step's calls over the engine, the hooks and the homes
  std::unique_ptr<GraphedPass> graphed_;       // train.cuda_graphs, where a pass can be captured
  bool graphed_now_ = false;                   // the current pass ran from its graph
  std::unique_ptr<RunState> state_;
  std::unique_ptr<StepRecorder> recorder_;
  std::unique_ptr<MemoryBreakdown> memory_;
  std::unique_ptr<Evaluation> eval_;          // eval.dir: held-out losses per task
  bool declared_ = true;                      // comm.active: declared (else discovered)
  int64_t tasks_per_pass_ = 0;               // train.backward resolved: 0 = a micro-step's tasks in one pass
  std::vector<TaskLossTensor> task_losses_;  // read once per step (one sync)
  torch::Tensor loss_total_;
  int64_t step_queued_ = -1;                 // the last step whose update is queued
  int64_t nonfinite_checked_ = -1;           // the last step whose loss was checked (on every rank)
  int64_t nonfinite_steps_ = 0;               // train.on_nonfinite: skip_step / warn, for the log
  Clock::time_point setup_start_;             // build() after the data plane: the set-up logged at the first step
};

}  // namespace thetad::daemon
