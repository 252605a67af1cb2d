// One optimizer step of the Trainer (trainer_pieces.hpp): its micro-steps' passes (forward,
// backward through the hooks into the engine, the reduce), the update of each used group in its
// home, and the step's engine statistics for its record.
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "comm/bandwidth.hpp"
#include "common/log.hpp"
#include "daemon/ops/precision.hpp"
#include "daemon/plan/job_options.hpp"
#include "daemon/train/grad_norms.hpp"
#include "daemon/train/trainer_pieces.hpp"

namespace thetad::daemon {

// One optimizer step: accumulate_steps micro-steps (micro-step m of step s uses the schedule
// and data of index s*k+m); the engine reduces once, over the union of the window's groups. The
// window's plan is built once here and handed to every home.
void Trainer::train_step(int64_t step, PendingStep& p) {
  const int64_t k = job_.accumulate_steps;
  recorder_->mark(p, Phase::start);
  memory_->start_step(homes_->device_memory());
  const std::shared_ptr<const WindowPlan> window = protocol_->open_window(step, adam_settings(step));
  p.rec.task_loss.clear();
  task_losses_.clear();
  p.rec.forward_ms = p.rec.backward_ms = 0;
  torch::Tensor loss_sum;
  for (int64_t m = 0; m < k; ++m) {
    const int64_t micro = step * k + m;
    const bool last = m + 1 == k;
    const StepPlan plan = protocol_->start_micro(*window, m);
    // Passes over the plan's tasks: one, or one per task with rows (train.backward). For the
    // engine and the homes a pass is what a micro-step is: only the window's final pass syncs.
    const std::vector<std::pair<size_t, size_t>> passes = task_passes(plan);
    for (size_t i = 0; i < passes.size(); ++i) {
      const bool final = last && i + 1 == passes.size();
      protocol_->before_forward(final);
      torch::Tensor total = forward(micro, plan, passes[i].first, passes[i].second, p);
      protocol_->after_forward(total, final);
      backward(total, final, plan, p);
      loss_sum = loss_sum.defined() ? loss_sum + total.detach() : total.detach();
    }
  }
  loss_total_ = loss_sum;
}

// [first, end) ranges of plan.tasks: all of them at once, or, split, tasks_per_pass_ tasks with
// rows each (train.tasks_per_pass, or more where auto found them to fit; the last range what is
// left), in the plan's order.
std::vector<std::pair<size_t, size_t>> Trainer::task_passes(const StepPlan& plan) const {
  if (tasks_per_pass_ == 0) return {{0, plan.tasks.size()}};
  const auto per_pass = static_cast<size_t>(tasks_per_pass_);
  std::vector<std::pair<size_t, size_t>> passes;
  size_t in_pass = 0;
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    if (plan.task_rows[i] == 0) continue;
    if (in_pass == 0) passes.emplace_back(i, i + 1);
    passes.back().second = i + 1;
    in_pass = in_pass + 1 == per_pass ? 0 : in_pass + 1;
  }
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
  protocol_->backward(last, plan, [&] {
    if (graphed_now_) graphed_->backward(last);  // its gradients, computed in the graph, to the hooks
    else total.backward();
    if (act_stash_) act_stash_->end_backward();
  });
  // No host synchronization: on GPUs finish_backward makes the compute stream wait for the
  // last buckets (EngineOptions::wait_stream) and the marks around it time that stall.
  recorder_->mark(p, Phase::backward);
  // backward_ms is autograd's own time; the wait for the last buckets is comm_wait_ms, so that
  // the phases are disjoint and sum to at most step_ms.
  p.rec.backward_ms += ms_since(t1);
  if (last) {
    finish_reduce(p);
    // The reduced gradient's norms, read with the step's losses: where metrics are written, and
    // elsewhere those of the groups whose gradient this rank alone kept (they go to rank 0).
    p.grad = grad_norm_parts(*engine_, *groups_, homes_->grad_memory(), engine_->contributors(), data_.device,
                             /*kept_only=*/!recorder_->writes_metrics());
    protocol_->end_window();
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
  protocol_->finish_reduce();
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
                     {"homes_take_ms", homes_->take_ms()}});
}

// Lazy semantics: a group no rank used this step is not stepped at all; each used group is
// stepped in its home (some buckets were already, as they landed: optimizer.overlap).
void Trainer::optimizer_step(int64_t step, PendingStep& p, bool skip) {
  const auto t0 = Clock::now();
  AdamSettings s = adam_settings(step);
  p.rec.lr = s.lr;
  protocol_->step(s, skip, step);
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

}  // namespace thetad::daemon
