// The step loop of one rank: schedule -> count exchange -> forward -> backward through the
// reducer (GradHooks into the engine, each launched bucket to its group's home) -> each group's
// optimizer step in its home -> per-step records, stop agreement and checkpoints (RunState).
// The trainer wires the pieces together and runs the loop; the pieces never call it, and it
// never asks where a group lives (Homes does). Here: the loop (Trainer::run) and run_worker;
// trainer_build.cpp: the wiring; trainer_step.cpp: one step (trainer_pieces.hpp).
#include "daemon/train/trainer.hpp"

#include <torch/torch.h>

#include <cmath>
#include <iomanip>
#include <memory>
#include <new>
#include <string>

#include "comm/bootstrap.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "daemon/plan/job_options.hpp"
#include "daemon/train/device_profile.hpp"
#include "daemon/train/stop_agreement.hpp"
#include "daemon/train/trainer_pieces.hpp"

namespace thetad::daemon {

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
int Trainer::run() {
  build();
  const int64_t start_step = state_->resume(opts_.resume);
  THETAD_LOG(info, "train") << "set-up to the first step: " << std::fixed << std::setprecision(2)
                            << ms_since(setup_start_) / 1000
                            << " s (model, engine, stores, resume; not the device's and NCCL's initialisation)";
  recorder_->start(start_step);
  if (eval_) eval_->resumed(start_step);  // before the export of a job already complete
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
  DeviceProfile profile(world_.rank);
  for (int64_t step = start_step; step < job_.steps; ++step) {
    const auto t_step = Clock::now();
    auto cur = std::make_unique<PendingStep>(step, world_.rank);
    profile.before_step(step);
    train_step(step, *cur);
    const bool skip = !lagged_check && nonfinite(step, loss_total_.item<double>(), cur->rec);
    {
      Timeline::Scope span(timeline_.get(), Lane::compute, "optimizer (queue)");
      optimizer_step(step, *cur, skip);
      step_queued_ = step;
      recorder_->queue_losses(*cur, loss_total_, task_losses_);
    }
    record_engine_stats(cur->rec);
    profile.after_step(step);
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
    // collective free of the host's shared memory for ranks that may never join it, before
    // anyone heard of the failure. Its MPI threads still stop first (MPI_Abort hangs while a
    // thread is inside MPI).
    comm::prepare_job_abort();
    throw;
  }
}

}  // namespace thetad::daemon
