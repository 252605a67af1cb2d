// Held-out evaluation per task (eval.dir): every eval.every_steps steps and at the run's end,
// each evaluated task's first eval.rows windows of its eval file (the same windows every time)
// run forward only — no gradient, no hook, no engine, no update — and their mean loss over the
// counted targets is that task's eval loss. On several ranks the tasks are split (task t on rank
// t mod world, the rank that also exports it) and the losses reach every rank through one
// allgather on the control plane (bounded by comm.timeout_s): rank 0 logs them and writes an
// evaluation record to the metrics, and at the end a table of each task's best eval loss and its
// step. export.best: eval_loss keeps a host copy of each task's adapter at its best eval loss
// (on its exporting rank) and the export writes that one. Every replica is made current first
// (Homes::make_current): under comm.sole_user: keep a task's current values may be on another rank.
#pragma once

#include <memory>

#include "comm/control_plane.hpp"
#include "config/job.hpp"
#include "daemon/device/data_plane.hpp"
#include "daemon/homes/homes.hpp"
#include "daemon/models/model.hpp"
#include "daemon/models/param_groups.hpp"
#include "daemon/state/run_state.hpp"
#include "daemon/train/step_record.hpp"

namespace thetad::daemon {

class Evaluation {
 public:
  virtual ~Evaluation() = default;
  // Without eval.dir: nullptr. Opens this rank's tasks' eval files (checked before the run) and,
  // with export.best: eval_loss, has `state`'s export read the kept adapters.
  static std::unique_ptr<Evaluation> create(const config::Job& job, TaskModel& model, const ParamGroups& groups,
                                            Homes& homes, comm::ControlPlane& plane, const DataPlane& data,
                                            StepRecorder& recorder, RunState& state);
  // After `completed` steps (their updates queued): evaluates when due (a multiple of
  // eval.every_steps, or the job's last step); at the run's `end` (the last step, or a stop) rank 0
  // logs the table of the best eval losses. Collective: every rank calls it at every step.
  virtual void after_step(int64_t completed, bool end) = 0;
  // The run starts after `step` (a resume, or 0): export.best: eval_loss takes up the best
  // adapters that earlier runs found up to it (best_adapters.hpp).
  virtual void resumed(int64_t step) = 0;
};

}  // namespace thetad::daemon
