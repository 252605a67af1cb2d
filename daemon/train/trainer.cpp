// The step loop of one rank: schedule -> count exchange -> forward -> backward through the
// reducer (GradHooks into the engine, each launched bucket to its group's home) -> each group's
// optimizer step in its home -> per-step records, stop agreement and checkpoints (RunState).
// The trainer wires the pieces together and runs the loop; the pieces never call it, and it
// never asks where a group lives (Homes does).
#include "daemon/train/trainer.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/bandwidth.hpp"
#include "comm/bootstrap.hpp"
#include "comm/control_plane.hpp"
#include "comm/engine.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/stopwatch.hpp"
#include "config/loader.hpp"
#include "daemon/core/device_memory_estimate.hpp"
#include "daemon/core/job_options.hpp"
#include "daemon/core/schedule.hpp"
#include "daemon/core/stop_agreement.hpp"
#include "daemon/core/timeline.hpp"
#include "daemon/device/data_plane.hpp"
#include "daemon/models/activation_stash.hpp"
#include "daemon/models/precision.hpp"
#include "daemon/models/model.hpp"
#include "daemon/models/param_groups.hpp"
#include "daemon/optim/optimizer.hpp"
#include "daemon/reducer/grad_hooks.hpp"
#include "daemon/state/run_state.hpp"
#include "daemon/homes/homes.hpp"
#include "daemon/train/evaluation.hpp"
#include "daemon/train/graphed_pass.hpp"
#include "daemon/train/grad_norms.hpp"
#include "daemon/train/memory_breakdown.hpp"
#include "daemon/train/step_record.hpp"
#include "offload/host_arena.hpp"

namespace thetad::daemon {
namespace {

using Clock = SteadyClock;

class Trainer {
 public:
  Trainer(const config::Job& job, const RunOptions& opts) : job_(job), opts_(opts), world_(comm::world_info()) {}
  int run();

 private:
  void build();
  void build_model();
  void build_engine();
  void train_step(int64_t step, PendingStep& p);
  torch::Tensor forward(int64_t micro, const StepPlan& plan, size_t first, size_t end, PendingStep& p);
  bool backward_per_task() const;
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
  std::shared_ptr<comm::Communicator> ctrl_;  // control plane: agreements, checkpoints (MPI)
  std::unique_ptr<comm::ControlPlane> plane_;
  DataPlane data_;                            // device, gradients' communicator, compute stream
  std::unique_ptr<Timeline> timeline_;
  std::unique_ptr<TaskModel> model_;
  std::unique_ptr<DataSource> batches_;
  std::unique_ptr<Schedule> schedule_;
  std::unique_ptr<ParamGroups> groups_;
  std::unique_ptr<comm::Engine> engine_;
  // Where each group lives (device, host store, streamed). Destroyed before the engine: the
  // stores' copies may still read the engine's gradient memory until their streams are done.
  std::unique_ptr<Homes> homes_;
  std::unique_ptr<PooledActivationStash> act_stash_;  // offload.activations: the trunk's saved tensors
  std::unique_ptr<GradHooks> hooks_;
  std::unique_ptr<GraphedPass> graphed_;       // train.cuda_graphs, where a pass can be captured
  bool graphed_now_ = false;                   // the current pass ran from its graph
  std::unique_ptr<RunState> state_;
  std::unique_ptr<StepRecorder> recorder_;
  std::unique_ptr<MemoryBreakdown> memory_;
  std::unique_ptr<Evaluation> eval_;          // eval.dir: held-out losses per task
  bool declared_ = true;                      // comm.active: declared (else discovered)
  bool per_task_ = false;                     // train.backward resolved: a backward per task
  std::vector<TaskLossTensor> task_losses_;  // read once per step (one sync)
  torch::Tensor loss_total_;
  int64_t step_queued_ = -1;                 // the last step whose update is queued
  int64_t nonfinite_checked_ = -1;           // the last step whose loss was checked (on every rank)
  int64_t nonfinite_steps_ = 0;               // train.on_nonfinite: skip_step / warn, for the log
  Clock::time_point setup_start_;             // build() after the data plane: the set-up logged at the first step
};

void Trainer::build() {
  // Every rank must run the same job: compare the settings that matter, name the first
  // differing key. First of all: ranks with different jobs must not start different collectives.
  ctrl_ = comm::make_mpi_communicator();
  ctrl_->set_default_timeout(comm_timeout(job_));
  plane_ = std::make_unique<comm::ControlPlane>(ctrl_, comm_timeout(job_));
  plane_->check_consistent("job", config::fingerprint(job_));
  data_ = open_data_plane(job_, world_, *plane_, ctrl_);
  // Before the model is built and anything is written: exit 2 on every rank where a device
  // cannot hold the job's lower bound.
  check_job_fits_device(job_, *plane_, world_.size, world_.rank, data_.gpu() ? data_.device.index() : -1,
                        data_.compute_stream, data_.device_sharers);
  if (!job_.timeline.path.empty())
    timeline_ = std::make_unique<Timeline>(config::expand_path(job_.timeline.path, job_, world_.rank), world_.rank);
  schedule_ = Schedule::create(job_, world_.size);
  setup_start_ = Clock::now();  // after the device's and NCCL's initialisation (open_data_plane)
  build_model();
  build_engine();
  // Before the hooks: the host stores move their groups' data to device placeholders.
  homes_->build(*engine_, *schedule_, world_.rank);
  hooks_ = std::make_unique<GradHooks>(*groups_, *engine_, data_, homes_->grad_memory());
  graphed_ = make_graphed_pass(job_, *model_, *groups_, *hooks_, data_);
  state_ = std::make_unique<RunState>(job_, world_, *plane_, *groups_, *homes_);
  // A rank's (task, micro-step) losses of one step: the most tasks of a plan with a row each.
  const int64_t per_micro = std::min(schedule_->max_tasks_per_plan(), job_.data.batch_per_rank);
  recorder_ = std::make_unique<StepRecorder>(job_, data_, *plane_, static_cast<size_t>(per_micro * job_.accumulate_steps));
  memory_ = std::make_unique<MemoryBreakdown>(data_);
  eval_ = Evaluation::create(job_, *model_, *groups_, *homes_, *plane_, data_, *recorder_, *state_);
  per_task_ = backward_per_task();
  if (per_task_ && schedule_->max_tasks_per_plan() > 1) {
    THETAD_LOG(info, "train") << "train.backward " << config::to_string(job_.train.backward)
                              << ": a forward and backward per task, one task's graph alive at a time";
  }
}

// train.backward: auto takes a pass per task where nothing is shared between the tasks'
// gradients (Θ frozen), so that the passes only split the work: each task's adapters get the same
// bits, and the activations of one task, not of all, are alive at once. A trained Θ would
// accumulate over the passes in another order, and a streamed trunk would stream its layers once
// per pass: there auto keeps one backward over the sum (per_task still splits, as gradient
// accumulation over the micro-step's tasks would).
bool Trainer::backward_per_task() const {
  switch (job_.train.backward) {
    case config::Backward::Joint: return false;
    case config::Backward::PerTask: return true;
    case config::Backward::Auto: break;
  }
  const bool split = !job_.model.train_shared && job_.offload.shared != config::SharedMode::Stream;
  // A model that fuses tasks (the transformer) runs a micro-step's tasks through its shared
  // layers in one pass where each task's rows alone would make kernels too small.
  const int64_t tasks = std::max<int64_t>(1, schedule_->max_tasks_per_plan());
  if (model_->fuses_tasks() && model_->fusing_pays(job_.data.batch_per_rank / tasks)) return false;
  return split;
}

// With a host store, the model is built on the host and Homes moves the resident groups to the
// device; the stores own the others from then on (θ[t] never lives on the device whole).
void Trainer::build_model() {
  const auto t_model = Clock::now();
  model_ = make_model(job_, Homes::model_device(job_, data_), Homes::lazy_tasks(job_));
  THETAD_LOG(info, "train") << "model " << config::to_string(job_.model.kind) << " built in " << std::fixed << std::setprecision(2)
                            << ms_since(t_model) / 1000 << " s";
  batches_ = make_data(job_, *model_, data_.device);
  groups_ = std::make_unique<ParamGroups>(model_->params(), static_cast<int>(job_.model.tasks) + 1);
  if (job_.offload.activations) {  // validation admits only models that can use it
    THETAD_CHECK(model_->stashes_activations(), InternalError, "offload.activations: model.kind ",
                 config::to_string(job_.model.kind), " has no activations to stash");
    act_stash_ = make_activation_stash(data_.device, data_.compute_stream);
    act_stash_->set_timeline(timeline_.get());
    model_->set_activation_stash(act_stash_.get());
  }
  homes_ = std::make_unique<Homes>(job_, *model_, *groups_, data_, timeline_.get());
}

void Trainer::build_engine() {
  const std::vector<comm::ParamInfo> infos = homes_->plan_params();
  auto plan = comm::make_bucket_plan(infos, groups_->num_groups(), bucket_plan_options(job_));
  plane_->check_consistent("bucket plan", plan.describe());
  THETAD_LOG(info, "engine") << "bucket plan: " << plan.buckets.size() << " buckets over " << groups_->num_groups()
                             << " groups, " << groups_->size() << " parameters, hash " << hex64(plan.hash);
  comm::EngineOptions eopts = engine_options(job_);
  declared_ = eopts.declared;
  if (data_.gpu()) {
    eopts.wait_stream = data_.compute_stream;
    eopts.count_comm = ctrl_;  // host flags, host result: MPI, independent of the GPU's queue
  }
  homes_->engine_options(eopts);  // each group's gradient memory; each bucket to its home
  engine_ = std::make_unique<comm::Engine>(data_.comm, std::move(plan), eopts);
}

// One optimizer step: accumulate_steps micro-steps (micro-step m of step s uses the schedule
// and data of index s*k+m); the engine reduces once, over the union of the window's groups.
void Trainer::train_step(int64_t step, PendingStep& p) {
  const int64_t k = job_.accumulate_steps;
  recorder_->mark(p, Phase::start);
  memory_->start_step(homes_->device_memory());
  engine_->start_window(step);
  hooks_->start_window();
  homes_->start_window(step, adam_settings(step));
  p.rec.task_loss.clear();
  task_losses_.clear();
  p.rec.forward_ms = p.rec.backward_ms = 0;
  torch::Tensor loss_sum;
  for (int64_t m = 0; m < k; ++m) {
    const int64_t micro = step * k + m;
    const bool last = m + 1 == k;
    const StepPlan plan = schedule_->plan(micro, world_.rank);
    hooks_->set_trained(plan.trained);
    homes_->start_micro(plan);
    if (declared_) engine_->declare_active(plan.trained);
    // Passes over the plan's tasks: one, or one per task with rows (train.backward). For the
    // engine and the homes a pass is what a micro-step is: only the window's final pass syncs.
    const std::vector<std::pair<size_t, size_t>> passes = task_passes(plan);
    for (size_t i = 0; i < passes.size(); ++i) {
      const bool final = last && i + 1 == passes.size();
      if (declared_ && final) engine_->begin_sync();  // the count exchange overlaps forward
      torch::Tensor total = forward(micro, plan, passes[i].first, passes[i].second, p);
      if (!declared_) {  // discovered from the graph, still before backward
        std::vector<uint8_t> found = hooks_->discover_groups(total);
        homes_->add_reached(found);  // streamed Θ has no leaves in the graph
        engine_->declare_active(found);
        if (final) engine_->begin_sync();
      }
      backward(total, final, plan, p);
      loss_sum = loss_sum.defined() ? loss_sum + total.detach() : total.detach();
    }
  }
  loss_total_ = loss_sum;
}

// [first, end) ranges of plan.tasks, each with rows: all of them at once, or one task each.
std::vector<std::pair<size_t, size_t>> Trainer::task_passes(const StepPlan& plan) const {
  if (!per_task_) return {{0, plan.tasks.size()}};
  std::vector<std::pair<size_t, size_t>> passes;
  for (size_t i = 0; i < plan.tasks.size(); ++i)
    if (plan.task_rows[i] > 0) passes.emplace_back(i, i + 1);
  return passes;
}

// The loss of the micro-step's tasks [first, end): each task's rows through the model, weighted by
// their share of the window's rows.
torch::Tensor Trainer::forward(int64_t micro, const StepPlan& plan, size_t first, size_t end, PendingStep& p) {
  const int64_t fwd_us = Timeline::now_us();
  const auto t0 = Clock::now();
  const int64_t rows_in_window = job_.data.batch_per_rank * job_.accumulate_steps;
  const AutocastScope autocast(job_.precision, data_.device);  // forward only; backward follows its casts
  const PassInputs in = pass_inputs(*batches_, plan, first, end, micro, world_.rank, world_.size, job_.seed);
  std::vector<double> weights;
  for (int64_t rows : in.rows) weights.push_back(double(rows) / double(rows_in_window));
  std::vector<torch::Tensor> losses = graphed_ ? graphed_->forward(in, weights) : std::vector<torch::Tensor>{};
  graphed_now_ = !losses.empty();
  if (!graphed_now_) losses = model_->losses(in.parts);
  torch::Tensor total;
  for (size_t i = 0; i < in.parts.size(); ++i) {
    task_losses_.push_back({in.parts[i].task, in.rows[i], losses[i].detach()});
    torch::Tensor weighted = losses[i] * weights[i];
    total = total.defined() ? total + weighted : weighted;
  }
  const double fwd_ms = ms_since(t0);
  p.rec.forward_ms += fwd_ms;
  recorder_->mark(p, Phase::forward);
  if (timeline_) timeline_->record(Lane::compute, "forward", fwd_us, int64_t(fwd_ms * 1000));
  return total;
}

// Backward through the hooks; in the window's last micro-step the engine launches buckets as
// they fill and finish_reduce waits for the rest.
void Trainer::backward(torch::Tensor& total, bool last, const StepPlan& plan, PendingStep& p) {
  const int64_t bwd_us = Timeline::now_us();
  const auto t1 = Clock::now();
  homes_->before_backward(last, plan);
  if (graphed_now_) graphed_->backward(last);  // its gradients, computed in the graph, to the hooks
  else total.backward();
  if (act_stash_) act_stash_->end_backward();
  hooks_->rethrow_error();
  homes_->after_backward(last);
  // No host synchronization: on GPUs finish_backward makes the compute stream wait for the
  // last buckets (EngineOptions::wait_stream) and the marks around it time that stall.
  recorder_->mark(p, Phase::backward);
  // backward_ms is autograd's own time; the wait for the last buckets is comm_wait_ms, so that
  // the phases are disjoint and sum to at most step_ms.
  p.rec.backward_ms += ms_since(t1);
  if (last) {
    finish_reduce(p);
    if (recorder_->writes_metrics())  // the reduced gradient's norms, read with the step's losses
      p.grad = grad_norm_parts(*engine_, *groups_, homes_->grad_memory(), engine_->contributors(), data_.device);
    homes_->after_reduce();
    hooks_->end_window();
  }
  const double bwd_ms = ms_since(t1);
  if (timeline_)
    timeline_->record(Lane::compute, last ? "backward+reduce" : "backward", bwd_us, int64_t(bwd_ms * 1000),
                      {{"bytes_allreduced", int64_t{last ? engine_->stats().bytes_allreduced : 0}}});
}

void Trainer::finish_reduce(PendingStep& p) {
  if (timeline_) {  // separates the count exchange's wait from the launches that follow
    Timeline::Scope span(timeline_.get(), Lane::comm, "wait for the count exchange");
    engine_->contributors();
  }
  const int64_t t_us = Timeline::now_us();
  engine_->finish_backward();
  const int64_t mark_us = Timeline::now_us();
  recorder_->mark(p, Phase::comm);
  if (!timeline_) return;
  const auto& st = engine_->stats();
  timeline_->record(Lane::comm, "allreduce (wait for the last buckets)", t_us, Timeline::now_us() - t_us,
                    {{"buckets_launched", int64_t{st.buckets_launched}},
                     {"buckets_pruned", int64_t{st.buckets_pruned}},
                     {"bytes", int64_t{st.bytes_allreduced}},
                     {"finish_launched", int64_t{st.finish_launched}},
                     {"finish_order_ms", st.finish_order_ms},
                     {"finish_launch_ms", st.finish_launch_ms},
                     {"finish_block_ms", st.finish_block_ms},
                     {"mark_ms", double(Timeline::now_us() - mark_us) / 1000.0},
                     {"launch_call_ms", st.launch_call_ms},
                     {"on_launch_ms", st.on_launch_ms}});
}

// train.on_nonfinite: step `step`'s loss is finite on every rank (one scalar, one agreement per
// step), or the policy decides: stop (every rank throws the first failing rank's message, exit 1),
// skip_step (true: no rank updates anything this step) or warn. skip_step must decide before the
// step's update, so it reads the loss at once (on GPUs the host then waits for backward each
// step); stop and warn read it one step late, with the metrics, so the host stays a step ahead
// (the update of the next step is already queued: a checkpoint never holds non-finite parameters
// anyway, they are checked before each). A non-finite update (optimizer.lr too large) shows in
// the next step's loss; the parameters are looked at only on failure, to say what is non-finite.
bool Trainer::nonfinite(int64_t step, double loss, StepRecord& rec) {
  if (step <= nonfinite_checked_) return rec.skipped != 0;  // checked before its checkpoint already
  nonfinite_checked_ = step;
  if (plane_->all_ok(std::isfinite(loss), {"allreduce of the loss check", step, -1})) return false;
  rec.nonfinite = 1;
  const std::string params = state_->first_nonfinite_param(0, 1);
  const std::string what =
      std::isfinite(loss) ? std::string() :
      "the loss of step " + std::to_string(step) + " is " + (std::isnan(loss) ? "nan" : "inf") + " on rank " +
          std::to_string(world_.rank) + "; " +
          (params.empty() ? "the parameters are finite (look at the inputs and targets, data.noise, optimizer.lr)"
           : step < step_queued_ ? "when it was read (the next step's update queued) " + params +
                                       " holds NaN or Inf (look at the inputs and targets, data.noise, optimizer.lr)"
                                 : params + " holds NaN or Inf (look at optimizer.lr)");
  const config::NonFinite policy = job_.train.on_nonfinite;
  if (policy == config::NonFinite::Stop) {
    plane_->agree(what.empty() ? nullptr : std::make_exception_ptr(Error("non-finite training: " + what +
                                                                         " (train.on_nonfinite: stop)")),
                  {"checking the loss for NaN and Inf", step, -1});
  }
  ++nonfinite_steps_;
  const bool skip = policy == config::NonFinite::SkipStep;
  rec.skipped = skip ? 1 : 0;
  // Every occurrence is in the metrics; the log names the first ones and then every 100th.
  if (nonfinite_steps_ <= 3 || nonfinite_steps_ % 100 == 0) {
    THETAD_LOG(warn, "train") << "non-finite loss at step " << step << (what.empty() ? " on another rank" : ": " + what)
                              << (skip ? "; the step is skipped on every rank" : "; training goes on (train.on_nonfinite: warn)")
                              << " (" << nonfinite_steps_ << " such steps so far)";
  }
  return skip;
}

// Lazy semantics: a group no rank used this step is not stepped at all; each used group is
// stepped in its home (some buckets were already, as they landed: optimizer.overlap).
void Trainer::optimizer_step(int64_t step, PendingStep& p, bool skip) {
  const auto t0 = Clock::now();
  AdamSettings s = adam_settings(step);
  p.rec.lr = s.lr;
  homes_->step(engine_->contributors(), s, skip);
  homes_->release_step(step);
  p.rec.optimizer_ms = ms_since(t0);
  recorder_->mark(p, Phase::optimizer);
}

AdamSettings Trainer::adam_settings(int64_t step) const {
  AdamSettings s;
  s.lr = lr_at(job_.optimizer, step, job_.steps);
  s.beta1 = job_.optimizer.beta1;
  s.beta2 = job_.optimizer.beta2;
  s.eps = job_.optimizer.eps;
  s.weight_decay = job_.optimizer.weight_decay;
  s.kind = job_.optimizer.kind;
  return s;
}

void Trainer::record_engine_stats(StepRecord& rec) {
  const auto& st = engine_->stats();
  if (!data_.gpu()) rec.comm_wait_ms = st.comm_wait_ms;  // GPUs: device time, StepRecorder::finish
  rec.count_exchange_ms = st.count_exchange_ms;
  rec.bytes_allreduced = st.bytes_allreduced;
  rec.bytes_pruned = st.bytes_pruned;
  rec.buckets_launched = st.buckets_launched;
  rec.buckets_pruned = st.buckets_pruned;
  rec.buckets_broadcast = st.buckets_broadcast;
  rec.buckets_kept = st.buckets_kept;
  rec.bytes_kept = st.bytes_kept;
  rec.allreduce_algbw_gbs = comm::algbw_gbs(static_cast<double>(st.allreduce_time.bytes), st.allreduce_time.ms);
  rec.allreduce_busbw_gbs = rec.allreduce_algbw_gbs * comm::bus_factor(comm::CollectiveKind::allreduce, world_.size);
  rec.broadcast_algbw_gbs = comm::algbw_gbs(static_cast<double>(st.broadcast_time.bytes), st.broadcast_time.ms);
  rec.comm_busy_ms = st.allreduce_time.ms + st.broadcast_time.ms;
  rec.grad_stream_peak_bytes = st.streamed_bytes_peak;
  rec.samples = job_.data.batch_per_rank;
  homes_->add_stats(rec);
  memory_->record(homes_->device_memory(), static_cast<int64_t>(engine_->buffer_bytes()),
                  static_cast<int64_t>(engine_->adopted_bytes()), rec);
  if (act_stash_) {
    const ActivationStats as = act_stash_->step_stats();
    rec.act_offload_bytes = as.d2h_bytes + as.h2d_bytes;
    rec.act_device_peak_bytes = as.device_peak_bytes;
    rec.act_layer_bytes = as.layer_peak_bytes;
    rec.act_pool_allocations = as.pool_allocations;
  }
  recorder_->progress().queued(job_.data.batch_per_rank * world_.size, st.bytes_pruned);
}

int Trainer::run() {
  build();
  const int64_t start_step = state_->resume(opts_.resume);
  THETAD_LOG(info, "train") << "set-up to the first step: " << std::fixed << std::setprecision(2)
                            << ms_since(setup_start_) / 1000
                            << " s (model, engine, stores, resume; not the device's and NCCL's initialisation)";
  recorder_->start(start_step);
  if (start_step == job_.steps) {
    THETAD_LOG(info, "train") << "job " << job_.name << " is already complete: resumed at step " << start_step
                              << " = steps; nothing to " << (job_.export_.any() ? "train" : "do")
                              << " (raise steps to train further)";
    // Its export is written again (it may have failed after the final checkpoint, or be stale).
    if (job_.export_.any()) state_->export_adapters(start_step, true, /*again=*/true);
  } else {
    THETAD_LOG(info, "train") << "job " << job_.name << ": " << world_.size << " ranks, " << job_.model.tasks
                              << " tasks, steps " << start_step << ".." << job_.steps;
  }
  StopAgreement stop(*plane_, job_.steps);
  int exit_code = kExitOk;
  std::unique_ptr<PendingStep> pending;  // the previous step, until its device work is read
  const bool lagged_check = job_.train.on_nonfinite != config::NonFinite::SkipStep;
  const auto flush = [&] {
    if (pending) {
      Timeline::Scope span(timeline_.get(), Lane::compute, "wait for the previous step's device work");
      if (lagged_check)
        recorder_->finish(*pending, [&](StepRecord& rec) { nonfinite(rec.step, rec.loss, rec); });
      else
        recorder_->finish(*pending);
    }
    pending.reset();
  };
  const RecordOnError record_on_error(*recorder_, pending);
  for (int64_t step = start_step; step < job_.steps; ++step) {
    const auto t_step = Clock::now();
    auto cur = std::make_unique<PendingStep>(step, world_.rank);
    train_step(step, *cur);
    const bool skip = !lagged_check && nonfinite(step, loss_total_.item<double>(), cur->rec);
    {
      Timeline::Scope span(timeline_.get(), Lane::compute, "optimizer (queue)");
      optimizer_step(step, *cur, skip);
      step_queued_ = step;
      recorder_->queue_losses(*cur, loss_total_, task_losses_);
    }
    record_engine_stats(cur->rec);
    // Step `step` is queued; the previous one has (nearly) finished on the device.
    flush();
    pending = std::move(cur);
    const int64_t completed = step + 1;
    if (step == start_step) state_->warm_up_checkpoints(completed);
    state_->poll_checkpoint(step);  // publishes a background checkpoint once every rank wrote it
    bool stop_now = false;
    {
      Timeline::Scope span(timeline_.get(), Lane::comm, "stop agreement");
      stop_now = stop.stop_after(step);
    }
    if (stop_now) {
      THETAD_LOG(warn, "train") << "stop requested (signal); " << (job_.checkpoint.dir.empty()
          ? "no checkpoint.dir: nothing is written, stopping after step " : "checkpointing at step ") << completed;
    }
    if (eval_) eval_->after_step(completed, stop_now || completed == job_.steps);  // before its checkpoint and export
    if (stop_now || completed == job_.steps ||
        (job_.checkpoint.every_steps > 0 && completed % job_.checkpoint.every_steps == 0))
    {
      // The run's last checkpoint (the end, a stop) is written before the loop ends: exit 0 or 4
      // means it is published. Others may be written in the background (checkpoint.async).
      const bool last = stop_now || completed == job_.steps;
      // A checkpoint that waits for the step checks its loss first (stop and warn read it one
      // step late otherwise), so that a stop names the loss, not the parameters it spoilt. One in
      // the background does not wait: its loss is read at the next step, before the write can
      // be refused for the parameters (poll_checkpoint), so a stop still names the loss.
      if (lagged_check && !state_->checkpoints_in_background(last))
        nonfinite(step, loss_total_.item<double>(), pending->rec);
      state_->checkpoint(completed, last);
      state_->export_adapters(completed, completed == job_.steps);  // export.adapters_dir, export.merged_dir
    }
    // step_ms: this iteration's wall time, its checkpoint included (written one step late).
    pending->rec.step_ms = ms_since(t_step);
    if (stop_now) {
      exit_code = kExitInterrupted;
      break;
    }
  }
  flush();
  state_->finish_checkpoint(job_.steps);  // none is left in flight: the last one was synchronous
  if (world_.rank == 0) {
    const auto t_hash = Clock::now();
    const std::string hash = hex64(state_->params_hash());
    THETAD_LOG(info, "train") << "final params hash: " << hash << " (computed in " << std::fixed << std::setprecision(1)
                              << ms_since(t_hash) / 1000 << " s)";
  }
  if (timeline_) timeline_->close();
  return exit_code;
}

}  // namespace

namespace {

// An allocation that failed, as one line (exit 1): LibTorch's own messages carry its C++ frames
// ("Exception raised from ... frame #0 ..."), which tell a user nothing.
std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  return text;
}

[[noreturn]] void rethrow_allocation_failure() {
  const char* hint = " (see docs/configuration.md, \"Memory\")";
  try {
    throw;
  } catch (const c10::OutOfMemoryError& e) {
    throw Error("out of device memory: " + one_line(e.what_without_backtrace()) + hint);
  } catch (const c10::Error& e) {
    const std::string m = e.what_without_backtrace();
    if (m.find("can't allocate memory") != std::string::npos || m.find("not enough memory") != std::string::npos)
      throw Error("out of host memory: " + one_line(m) + hint);
    throw InternalError("LibTorch: " + one_line(m));
  } catch (const std::bad_alloc& e) {
    throw Error(std::string("out of host memory (") + e.what() + ")" + hint);
  }
}

}  // namespace

int run_worker(const config::Job& job, const RunOptions& opts) {
  Trainer t(job, opts);
  try {
    try {
      return t.run();
    } catch (const c10::Error&) {
      rethrow_allocation_failure();
    } catch (const std::bad_alloc&) {
      rethrow_allocation_failure();
    }
  } catch (...) {
    // The job is about to be aborted (main): the trainer's destructor must not wait in the
    // collective free of the host's shared window for ranks that may never join it, before
    // anyone heard of the failure. Its MPI threads still stop first (MPI_Abort hangs while a
    // thread is inside MPI).
    int size = 1;  // (not world_info(): that one is collective; and nothing may throw here)
    MPI_CHECK_NOTHROW(MPI_Comm_size(MPI_COMM_WORLD, &size));
    if (size > 1) offload::HostArena::abandon_on_destruction();
    throw;
  }
}

}  // namespace thetad::daemon
