// Per-step records read one step late (see step_record.hpp).
#include "daemon/train/step_record.hpp"

#include <cmath>
#include <exception>
#include <map>

#if THETAD_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/poll.hpp"
#include "config/loader.hpp"
#include "daemon/observe/task_losses.hpp"

namespace thetad::daemon {

struct PendingStep::DeviceMarks {
#if THETAD_TORCH_CUDA
  std::vector<std::pair<Phase, std::shared_ptr<at::cuda::CUDAEvent>>> phases;
  std::shared_ptr<at::cuda::CUDAEvent> done;  // losses copied
#endif
};

PendingStep::PendingStep(int64_t step, int rank) : marks(std::make_unique<DeviceMarks>()) {
  rec.step = step;
  rec.rank = rank;
}
PendingStep::~PendingStep() = default;

StepRecorder::StepRecorder(const config::Job& job, const DataPlane& plane, comm::ControlPlane& ctrl,
                           size_t max_task_losses)
    : job_(job), plane_(plane), ctrl_(ctrl), max_task_losses_(max_task_losses), rank_(ctrl.rank()) {}

void StepRecorder::start(int64_t start_step) {
  // A resumed run appends to its metrics, a fresh one starts a new file (an earlier run's moved
  // aside, never overwritten).
  if (!job_.metrics.path.empty() && (rank_ == 0 || job_.metrics.all_ranks)) {
    metrics_ = std::make_unique<MetricsWriter>(config::expand_path(job_.metrics.path, job_, rank_),
                                               /*resume_step=*/start_step, config::to_yaml(job_));
    if (!metrics_->moved_aside().empty()) {
      THETAD_LOG(warn, "metrics") << "a fresh run: the earlier run's metrics " << metrics_->path() << " were moved to "
                                  << metrics_->moved_aside() << " (with its .job.yaml)";
    }
  }
  progress_ = std::make_unique<Progress>(job_, rank_, start_step);
  written_step_ = start_step - 1;
}

void StepRecorder::write_eval(const EvalRecord& rec) {
  if (!metrics_) return;
  evals_.push_back(rec);
  if (written_step_ >= rec.step - 1) {  // its step's record is out already (a resumed run's first evaluation)
    for (const EvalRecord& e : evals_) metrics_->write(e);
    evals_.clear();
  }
}

void StepRecorder::mark(PendingStep& p, Phase phase) const {
#if THETAD_TORCH_CUDA
  if (!plane_.gpu()) return;
  auto ev = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);  // with timing
  ev->record(c10::cuda::getCurrentCUDAStream(plane_.device.index()));
  p.marks->phases.emplace_back(phase, std::move(ev));
#else
  (void)p;
  (void)phase;
#endif
}

void StepRecorder::queue_losses(PendingStep& p, const torch::Tensor& total,
                                const std::vector<TaskLossTensor>& task_losses) const {
  std::vector<torch::Tensor> ls{total.reshape({})};
  for (const TaskLossTensor& t : task_losses) {
    ls.push_back(t.loss.reshape({}));
    p.tasks.push_back(t.task);
    p.rows.push_back(t.rows);
  }
  torch::Tensor packed = torch::stack(ls).to(torch::kFloat32);
  if (p.grad.norms.defined()) packed = torch::cat({packed, p.grad.norms.to(torch::kFloat32)});  // one copy for both
#if THETAD_TORCH_CUDA
  if (plane_.gpu()) {
    p.losses = torch::empty({packed.numel()}, torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(true));
    p.losses.copy_(packed, /*non_blocking=*/true);
    p.marks->done = std::make_shared<at::cuda::CUDAEvent>();
    p.marks->done->record(c10::cuda::getCurrentCUDAStream(plane_.device.index()));
    return;
  }
#endif
  p.losses = packed.contiguous();
}

// The record's time stamp and throughput (every rank's rows, and positions for token models, over
// the step's wall time).
void StepRecorder::add_rates(StepRecord& rec) const {
  rec.time = utc_time_now();
  const double rows = double(job_.data.batch_per_rank) * double(job_.accumulate_steps) * double(ctrl_.size());
  const bool tokens = job_.model.kind == config::ModelKind::Transformer || job_.data.kind == config::DataKind::Tokens;
  if (rec.step_ms > 0) {
    rec.samples_per_s = rows / (rec.step_ms / 1000.0);
    if (tokens) rec.tokens_per_s = rows * double(job_.model.seq_len) / (rec.step_ms / 1000.0);
  }
}

namespace {

// The squared norms per group of this rank's pieces (`norms`: read with the step's losses). A
// group this rank kept is on no other rank: its square goes on its task's first entry of `mine`,
// on its way to rank 0 with the task losses.
std::map<int, double> group_squares(const GradNormParts& grad, const float* norms, std::vector<TaskRowsLoss>& mine) {
  std::map<int, double> squares, kept;
  for (size_t i = 0; i < grad.group.size(); ++i) {
    const double n = norms[i];
    (grad.kept[i] ? kept : squares)[grad.group[i]] += n * n;
  }
  for (TaskRowsLoss& e : mine) {
    const auto it = kept.find(e.task + 1);
    if (it == kept.end()) continue;
    e.kept_grad_sq = it->second;
    kept.erase(it);
  }
  return squares;
}

// The gradient norms: this rank's squares and the kept groups' of `entries` (rank 0: every rank's).
void set_grad_norms(StepRecord& rec, bool whole, std::map<int, double> squares, const std::vector<TaskRowsLoss>& entries) {
  for (const TaskRowsLoss& e : entries)
    if (e.kept_grad_sq >= 0) squares[e.task + 1] += e.kept_grad_sq;
  if (squares.empty() && whole) return;
  double total = 0;
  for (const auto& [g, sq] : squares) total += sq;
  rec.grad_norm = whole ? std::sqrt(total) : std::nan("");
  rec.grad_norm_task.clear();
  for (const auto& [g, sq] : squares)
    if (g > 0) rec.grad_norm_task.push_back({g - 1, std::sqrt(sq)});
}

}  // namespace

void StepRecorder::finish(PendingStep& p, const std::function<void(StepRecord&)>& before_write, bool gather) {
  if (p.written) return;
  StepRecord& rec = p.rec;
#if THETAD_TORCH_CUDA
  if (p.marks->done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(plane_.comm->default_timeout());
    if (!poll_until([&] { return p.marks->done->query(); }, deadline, std::chrono::microseconds(50)))
      throw TimeoutError(detail::concat("step ", rec.step, " did not finish on ", plane_.device.str(),
                                        " within comm.timeout_s = ", job_.comm.timeout_s, " s"));
    // Device times between consecutive marks, charged to the later mark's phase.
    rec.forward_ms = rec.backward_ms = rec.comm_wait_ms = rec.optimizer_ms = 0;
    const auto& m = p.marks->phases;
    for (size_t i = 1; i < m.size(); ++i) {
      const double ms = m[i - 1].second->elapsed_time(*m[i].second);
      switch (m[i].first) {
        case Phase::forward: rec.forward_ms += ms; break;
        case Phase::backward: rec.backward_ms += ms; break;
        case Phase::comm: rec.comm_wait_ms += ms; break;
        case Phase::optimizer: rec.optimizer_ms += ms; break;
        case Phase::start: break;
      }
    }
  }
#endif
  const float* l = p.losses.data_ptr<float>();
  rec.loss = l[0];
  std::vector<TaskRowsLoss> mine;
  for (size_t i = 0; i < p.tasks.size(); ++i) mine.push_back({p.tasks[i], p.rows[i], l[i + 1]});
  add_rates(rec);
  const std::map<int, double> squares = group_squares(p.grad, l + 1 + p.tasks.size(), mine);
  set_grad_norms(rec, p.grad.whole, squares, mine);
  rec.task_loss = merge_task_losses(mine);
  // Every rank's tasks to rank 0 (the others wait for it too: a collective of every rank).
  comm::ControlPlane::Gathered all =
      gather && ctrl_.size() > 1
          ? ctrl_.post_gather(pack_task_losses(mine, max_task_losses_), {"allgather of the step's task losses", rec.step, -1})
          : comm::ControlPlane::Gathered();
  // `wait` false (an error unwinds): only what already arrived, never a wait on ranks maybe gone.
  const auto add_others = [&](bool wait) {
    if (!all.posted() || (!wait && !all.ready())) return;
    const std::vector<int64_t>& words = all.get();
    if (rank_ != 0) return;
    const std::vector<TaskRowsLoss> every = unpack_task_losses(words, ctrl_.size(), max_task_losses_);
    rec.task_loss = merge_task_losses(every);
    set_grad_norms(rec, p.grad.whole, squares, every);
  };
  // step_ms and the device memory come with the record (the trainer's, at the step's end on the host).
  const auto write = [&] {
    p.written = true;
    written_step_ = std::max(written_step_, rec.step);
    if (metrics_) {
      metrics_->write(rec);
      for (const EvalRecord& e : evals_) metrics_->write(e);  // evaluations after this step
      evals_.clear();
    }
    progress_->finished(rec);
  };
  try {
    if (before_write) before_write(rec);
  } catch (...) {
    try {
      add_others(false);
    } catch (...) {  // the error already unwinding is the one to report
    }
    write();  // the step ran: its record says so (nonfinite: 1), then the error stops the run
    throw;
  }
  add_others(true);
  write();
  log::check_file();  // like the metrics: a log.file that cannot be written stops the run
}

RecordOnError::RecordOnError(StepRecorder& recorder, const std::unique_ptr<PendingStep>& pending)
    : recorder_(recorder), pending_(pending), uncaught_(std::uncaught_exceptions()) {}

RecordOnError::~RecordOnError() {
  if (std::uncaught_exceptions() <= uncaught_ || !pending_ || pending_->written) return;
  try {
    recorder_.finish(*pending_, {}, /*gather=*/false);
  } catch (...) {  // the error already unwinding is the one to report
  }
}

}  // namespace thetad::daemon
