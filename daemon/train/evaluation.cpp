// Held-out evaluation per task (see evaluation.hpp).
#include "daemon/train/evaluation.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <iomanip>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include "common/log.hpp"
#include "common/stopwatch.hpp"
#include "daemon/ops/precision.hpp"
#include "daemon/data/token_data.hpp"
#include "daemon/plan/input_path.hpp"
#include "daemon/plan/token_files.hpp"
#include "daemon/train/best_adapters.hpp"

namespace thetad::daemon {
namespace {

using Clock = SteadyClock;

// A group's parameters lent to a forward by its home (the host store binds θ[t] to the device
// only within a step), given back at scope exit.
struct Lent {
  std::function<void()> give_back;
  ~Lent() {
    if (give_back) give_back();
  }
};

// A task's best evaluation so far.
struct Best {
  double loss = std::numeric_limits<double>::infinity();
  int64_t step = -1;
  double last = std::nan("");
  int64_t last_step = -1;
};

class TaskEvaluation final : public Evaluation {
 public:
  TaskEvaluation(const config::Job& job, TaskModel& model, const ParamGroups& groups, Homes& homes,
                 comm::ControlPlane& plane, const DataPlane& data, StepRecorder& recorder)
      : job_(job), model_(model), groups_(groups), homes_(homes), plane_(plane), data_(data), recorder_(recorder),
        rank_(plane.rank()), world_(plane.size()), keep_best_(job.export_.best == config::ExportPick::EvalLoss),
        kept_files_(job) {
    std::vector<int> mine;
    for (int t : eval_tasks_of_run(job, world_))
      if (t % world_ == rank_) mine.push_back(t);
    files_ = make_eval_tokens(with_input_paths(job, rank_), mine);  // eval.dir as this rank reads it
  }

  void after_step(int64_t completed, bool end) override {
    const int64_t every = job_.eval.every_steps;
    if ((every > 0 && completed % every == 0) || completed == job_.steps) evaluate(completed);
    if (end && rank_ == 0) table();
  }

  void resumed(int64_t step) override {
    if (!keep_best_) return;
    int64_t taken = 0;
    for (int t : eval_tasks_of_run(job_, world_)) {
      if (t % world_ != rank_) continue;
      std::optional<BestAdapter> b = kept_files_.load(t, groups_, step);
      if (!b) continue;
      best_[t].loss = b->loss;
      best_[t].step = b->step;
      kept_[t + 1] = std::move(b->state);
      ++taken;
    }
    if (taken > 0) {
      THETAD_LOG(info, "eval") << "export.best: the best adapters of " << taken << " task(s) found by earlier runs (up to step "
                               << step << ") taken up";
    }
  }

  // export.best: this rank's kept adapter of group g, if any.
  std::optional<GroupState> kept(int g) const {
    const auto it = kept_.find(g);
    if (it == kept_.end()) return std::nullopt;
    return it->second;
  }

 private:
  // This rank's tasks of `tasks`: each one's mean loss over its counted targets (NaN: none) and
  // their count, from one read of the device's losses.
  void run_mine(const std::vector<int>& tasks, std::vector<double>& loss, std::vector<int64_t>& counted) {
    torch::NoGradGuard no_grad;  // no graph: nothing for the hooks or the engine, no gradient
    const AutocastScope autocast(job_.precision, data_.device);
    const int64_t per_pass = job_.data.batch_per_rank;  // the same passes on any number of ranks
    std::vector<torch::Tensor> parts;
    std::vector<std::pair<size_t, int64_t>> owner;  // per pass: its task's index, its counted targets
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (tasks[i] % world_ != rank_) continue;
      const int t = tasks[i];
      const Lent lent{homes_.of(t + 1).lend_to_forward(t + 1)};
      const int64_t rows = std::min(job_.eval.rows, files_->windows(t));
      for (int64_t first = 0; first < rows; first += per_pass) {
        const Batch host = files_->rows(t, first, std::min(per_pass, rows - first));
        const int64_t n = host.y.ge(0).sum().item<int64_t>();
        const Batch b{host.x.to(data_.device), host.y.to(data_.device)};
        const std::vector<TaskRows> part{{t, &b, 0}};
        parts.push_back(model_.losses(part)[0].detach().to(torch::kFloat32).reshape({}));
        owner.emplace_back(i, n);
      }
    }
    if (parts.empty()) return;
    const torch::Tensor host = torch::stack(parts).to(torch::kCPU, torch::kFloat64);  // the one wait
    std::vector<double> sum(tasks.size(), 0.0);
    for (size_t k = 0; k < owner.size(); ++k) {
      const auto [i, n] = owner[k];
      sum[i] += host[static_cast<int64_t>(k)].item<double>() * double(n);
      counted[i] += n;
    }
    for (size_t i = 0; i < tasks.size(); ++i)
      if (tasks[i] % world_ == rank_) loss[i] = counted[i] > 0 ? sum[i] / double(counted[i]) : std::nan("");
  }

  // Every rank's losses of its tasks to every rank: one allgather of two words per task.
  void gather(const std::vector<int>& tasks, std::vector<double>& loss, std::vector<int64_t>& counted, int64_t completed) {
    if (world_ == 1) return;
    std::vector<int64_t> words(2 * tasks.size(), 0);
    for (size_t i = 0; i < tasks.size(); ++i) {
      std::memcpy(&words[2 * i], &loss[i], sizeof(double));
      words[2 * i + 1] = counted[i];
    }
    comm::ControlPlane::Gathered all = plane_.post_gather(words, {"allgather of the tasks' eval losses", completed, -1});
    const std::vector<int64_t>& got = all.get();
    for (size_t i = 0; i < tasks.size(); ++i) {
      const size_t from = static_cast<size_t>(tasks[i] % world_) * words.size();
      std::memcpy(&loss[i], &got[from + 2 * i], sizeof(double));
      counted[i] = got[from + 2 * i + 1];
    }
  }

  void evaluate(int64_t completed) {
    const auto t0 = Clock::now();
    const std::vector<int> tasks = eval_tasks_at(job_, world_, completed);
    if (tasks.empty()) return;  // eval.tasks: scheduled, and none trained since the last point (alike on every rank)
    // Under comm.sole_user: keep a task trained on another rank than t mod world leaves this
    // rank's replica stale; evaluating it (and keeping it as the best) would read its old values.
    homes_.make_current();
    std::vector<double> loss(tasks.size(), std::nan(""));
    std::vector<int64_t> counted(tasks.size(), 0);
    run_mine(tasks, loss, counted);
    gather(tasks, loss, counted, completed);
    EvalRecord rec;
    rec.step = completed;
    rec.time = utc_time_now();
    for (size_t i = 0; i < tasks.size(); ++i) {
      rec.eval_loss.push_back({tasks[i], loss[i]});
      rec.eval_tokens.push_back(counted[i]);
      Best& b = best_[tasks[i]];
      b.last = loss[i];
      b.last_step = completed;
      if (!(loss[i] < b.loss)) continue;  // NaN never improves
      b.loss = loss[i];
      b.step = completed;
      if (keep_best_ && tasks[i] % world_ == rank_) {
        keep(tasks[i] + 1);
        kept_files_.save(tasks[i], {b.loss, b.step, kept_[tasks[i] + 1]});  // for a resume or a run again
      }
    }
    rec.eval_ms = ms_since(t0);
    recorder_.write_eval(rec);
    if (rank_ == 0) log_line(rec);
  }

  // A host copy of group g's parameters now (its best eval loss so far).
  void keep(int g) {
    const Lent lent{homes_.of(g).lend_to_forward(g)};  // its current values, wherever its home keeps them
    GroupState st;
    st.group = g;
    st.steps = homes_.group_steps()[static_cast<size_t>(g)];
    for (int p : groups_.members[static_cast<size_t>(g)]) {
      st.names.push_back(groups_[p].name);
      st.params.push_back(groups_[p].tensor.detach().to(torch::kCPU, torch::kFloat32, false, /*copy=*/true));
    }
    kept_[g] = std::move(st);
  }

  void log_line(const EvalRecord& rec) const {
    double sum = 0;
    int64_t n = 0;
    std::ostringstream tasks;
    tasks << std::fixed << std::setprecision(4);
    for (size_t i = 0; i < rec.eval_loss.size(); ++i) {
      if (std::isfinite(rec.eval_loss[i].loss)) {
        sum += rec.eval_loss[i].loss;
        ++n;
      }
      if (i < kProgressTasks) tasks << " t" << rec.eval_loss[i].task << "=" << rec.eval_loss[i].loss;
    }
    if (rec.eval_loss.size() > kProgressTasks)
      tasks << " (+" << rec.eval_loss.size() - kProgressTasks << " tasks: metrics.path)";
    THETAD_LOG(info, "eval") << "eval after step " << rec.step << ": mean " << std::fixed << std::setprecision(4)
                             << (n ? sum / double(n) : std::nan("")) << " over " << n << " task(s) |" << tasks.str()
                             << " | " << std::setprecision(1) << rec.eval_ms << " ms";
  }

  void table() const {
    if (best_.empty()) return;
    std::ostringstream out;
    out << "best eval loss per task (" << best_.size() << " task(s))" << (keep_best_ ? ", exported at its step" : "")
        << ":\n  " << std::setw(5) << "task" << "  " << std::setw(9) << "best" << "  " << std::setw(8) << "at step"
        << "  " << std::setw(9) << "last" << "  " << std::setw(8) << "at step";
    out << std::fixed;
    for (const auto& [t, b] : best_) {
      out << "\n  " << std::setw(5) << t << "  " << std::setprecision(4) << std::setw(9) << b.loss << "  "
          << std::setw(8) << b.step << "  " << std::setw(9) << b.last << "  " << std::setw(8) << b.last_step;
    }
    THETAD_LOG(info, "eval") << out.str();
  }

  const config::Job& job_;
  TaskModel& model_;
  const ParamGroups& groups_;
  Homes& homes_;
  comm::ControlPlane& plane_;
  const DataPlane& data_;
  StepRecorder& recorder_;
  const int rank_, world_;
  const bool keep_best_;
  std::unique_ptr<EvalTokens> files_;  // this rank's tasks' eval windows
  std::map<int, Best> best_;           // per task evaluated so far (this run)
  std::map<int, GroupState> kept_;     // export.best: per group of this rank, its adapter at its best
  const BestAdapters kept_files_;      // the same, in the checkpoint directory
};

}  // namespace

std::unique_ptr<Evaluation> Evaluation::create(const config::Job& job, TaskModel& model, const ParamGroups& groups,
                                               Homes& homes, comm::ControlPlane& plane, const DataPlane& data,
                                               StepRecorder& recorder, RunState& state) {
  if (job.eval.dir.empty()) return nullptr;
  auto eval = std::make_unique<TaskEvaluation>(job, model, groups, homes, plane, data, recorder);
  if (job.export_.best == config::ExportPick::EvalLoss) {
    const TaskEvaluation* e = eval.get();
    state.export_from([e](int g) { return e->kept(g); });
  }
  return eval;
}

}  // namespace thetad::daemon
