// The Trainer's construction: the job checked alike on every rank, the data plane, the model and
// its data, the groups' homes, the engine and its bucket plan, the hooks, the run state and the
// records, each handed what it needs (trainer_pieces.hpp).
#include <torch/torch.h>

#include <algorithm>
#include <iomanip>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/thread_pool.hpp"
#include "config/loader.hpp"
#include "daemon/ops/precision.hpp"
#include "daemon/plan/activation_estimate.hpp"
#include "daemon/plan/device_memory_estimate.hpp"
#include "daemon/plan/memory_estimate.hpp"
#include "daemon/plan/job_options.hpp"
#include "daemon/train/trainer_pieces.hpp"

namespace thetad::daemon {

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
  placement_ = Placement::of(job_, world_.size);
  schedule_ = Schedule::create(job_, world_.size);
  plans_ = std::make_unique<WindowPlans>(*schedule_, job_.accumulate_steps);
  setup_start_ = Clock::now();  // after the device's and NCCL's initialisation (open_data_plane)
  // The rank's CPU work (a base's load, the initial values, the final hash, a host store's CPU
  // AdamW) on one pool sized once, here: the rank's share of the host's CPUs (cpu_share: ranks not
  // bound to cores each see all of them), or where the model has a host store, its CPU AdamW
  // threads (cpu_adam_threads, the rule the store logs by).
  ThreadPool::configure(placement_.model_on_host ? cpu_adam_threads(job_.offload.cpu_threads, world_.local_size)
                                                 : cpu_share(world_.local_size));
  build_model();
  build_engine();
  // Before the hooks: the host stores move their groups' data to device placeholders.
  homes_->build(*engine_, *plans_, world_.rank);
  hooks_ = std::make_unique<GradHooks>(*groups_, *engine_, data_, homes_->grad_memory(), homes_->launch_handler());
  protocol_ = std::make_unique<StepProtocol>(*engine_, *hooks_, *homes_, *plans_, declared_, world_.rank);
  graphed_ = make_graphed_pass(job_, placement_, *model_, *groups_, *hooks_, data_);
  state_ = std::make_unique<RunState>(job_, world_, *plane_, *groups_, *homes_);
  // A rank's (task, micro-step) losses of one step: the most tasks of a plan with a row each.
  const int64_t per_micro = std::min(schedule_->max_tasks_per_plan(), job_.data.batch_per_rank);
  recorder_ = std::make_unique<StepRecorder>(job_, data_, *plane_, static_cast<size_t>(per_micro * job_.accumulate_steps));
  memory_ = std::make_unique<MemoryBreakdown>(data_);
  eval_ = Evaluation::create(job_, *model_, *groups_, *homes_, *plane_, data_, *recorder_, *state_);
  tasks_per_pass_ = resolve_tasks_per_pass();
  if (tasks_per_pass_ > 0 && schedule_->max_tasks_per_plan() > 1) {
    const int64_t k = tasks_per_pass_;
    THETAD_LOG(info, "train") << "train.backward " << config::to_string(job_.train.backward)
                              << (k == 1 ? ": a forward and backward per task, one task's graph alive at a time"
                                         : ": a forward and backward per " + std::to_string(k) +
                                               " tasks, their graph alive at a time");
  }
}

// train.backward: auto takes a pass per task where nothing is shared between the tasks'
// gradients (Θ frozen), so that the passes only split the work: each task's adapters get the same
// bits, and the activations of one task, not of all, are alive at once (Placement::split_passes;
// per_task still splits, as gradient accumulation over the micro-step's tasks would). A model
// that fuses tasks (the transformer) runs a micro-step's tasks through its shared layers in one
// pass wherever that pass's activations fit what the device has free once the model, its
// adapters and the engine's buffers are in place (fewer, larger kernels: 180 ms against 244 for
// the 1.1 B Llama's 8 tasks on one H200); every rank must fit, or all split, each pass then of as
// many tasks as fit every rank (at least train.tasks_per_pass). 0: one pass; else the tasks a pass
// runs.
int64_t Trainer::resolve_tasks_per_pass() const {
  const config::Backward key = job_.train.backward;
  const int64_t asked = job_.train.tasks_per_pass;
  if (key != config::Backward::Auto || !placement_.split_passes || !model_->fuses_tasks())
    return placement_.backward_per_task(key, false) ? asked : 0;
  const ActivationEstimate act = transformer_activations(job_);
  const int64_t tokens = job_.data.batch_per_rank * job_.model.seq_len;  // a micro-step's rows
  const int64_t joint = act.bytes_per_token * tokens;
  int64_t free_bytes = 0, total_bytes = 0;
  std::string where;
  const bool known = device_memory_for_check(data_.gpu() ? data_.device.index() : -1, data_.compute_stream,
                                             data_.device_sharers, &free_bytes, &total_bytes, &where);
  const bool fits = plane_->all_ok(!known || joint_pass_fits(joint, free_bytes, total_bytes),
                                   {"train.backward auto: the joint pass's memory"});
  int64_t per_pass = 0;
  if (!fits) {
    // A task's share of the micro-step's rows (round up: the schedule splits them evenly).
    const int64_t tasks = std::max<int64_t>(1, std::min(schedule_->max_tasks_per_plan(), job_.data.batch_per_rank));
    const int64_t task_bytes = std::max<int64_t>(1, joint / tasks + (joint % tasks != 0));
    int64_t k = 1;
    while (k + 1 < tasks && joint_pass_fits(task_bytes * (k + 1), free_bytes, total_bytes)) ++k;
    per_pass = plane_->min(std::vector<int64_t>{std::max(k, asked)}, {"train.backward auto: the tasks a pass fits"}).front();
  }
  if (world_.rank == 0) {
    std::ostringstream why;
    why << "the joint pass's activations about " << format_bytes(double(joint)) << " (" << tokens << " tokens x "
        << act.bytes_per_token << " B: " << act.parts << ")";
    if (known)
      why << (fits ? " fit " : " do not fit ") << where << "'s " << format_bytes(double(free_bytes)) << " free of "
          << format_bytes(double(total_bytes)) << " with a tenth of it to spare";
    THETAD_LOG(info, "train") << "train.backward auto: "
                              << (fits ? std::string("the micro-step's tasks in one pass")
                                       : per_pass == 1 ? std::string("a pass per task")
                                                       : "passes of " + std::to_string(per_pass) + " tasks")
                              << ": " << why.str();
  }
  return per_pass;
}

// With a host store, the model is built on the host (its task groups lazily, drawn by the store)
// and Homes moves the resident groups to the device; the stores own the others from then on
// (θ[t] never lives on the device whole).
void Trainer::build_model() {
  const auto t_model = Clock::now();
  model_ = make_model(inputs_, placement_, Homes::model_device(placement_, data_), placement_.lazy_tasks, data_.device);
  THETAD_LOG(info, "train") << "model " << config::to_string(job_.model.kind) << " built in " << std::fixed << std::setprecision(2)
                            << ms_since(t_model) / 1000 << " s";
  batches_ = make_data(inputs_, *model_, data_.device);
  groups_ = std::make_unique<ParamGroups>(model_->params(), static_cast<int>(job_.model.tasks) + 1);
  if (job_.offload.activations) {  // validation admits only models that can use it
    THETAD_CHECK(model_->stashes_activations(), InternalError, "offload.activations: model.kind ",
                 config::to_string(job_.model.kind), " has no activations to stash");
    act_stash_ = make_activation_stash(data_.device, data_.compute_stream);
    act_stash_->set_timeline(timeline_.get());
    model_->set_activation_stash(act_stash_.get());
  }
  homes_ = std::make_unique<Homes>(job_, placement_, *model_, *groups_, data_, timeline_.get());
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

}  // namespace thetad::daemon
