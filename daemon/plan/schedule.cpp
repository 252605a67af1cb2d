// Task schedules (round_robin, weighted, per_rank, all, alternate). Everything here is a pure
// function of the job and (step, rank): no hidden state, so any rank can evaluate any other
// rank's plan and any future step's.
#include "daemon/plan/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "common/errors.hpp"
#include "config/loader.hpp"

namespace thetad::daemon {
namespace {

// Non-negative a mod m for m > 0, without overflow for any int64 a.
int64_t mod(int64_t a, int64_t m) {
  int64_t r = a % m;
  return r < 0 ? r + m : r;
}

// (a * b) mod m without overflow: operands are already reduced below m (m fits in int).
int64_t mulmod(int64_t a, int64_t b, int64_t m) { return mod(mod(a, m) * mod(b, m), m); }

}  // namespace

std::vector<int64_t> split_rows(int64_t total, int64_t parts) {
  std::vector<int64_t> rows;
  if (parts <= 0) return rows;
  rows.assign(static_cast<size_t>(parts), total / parts);
  for (int64_t i = 0; i < total % parts; ++i) rows[static_cast<size_t>(i)] += 1;
  return rows;
}

std::unique_ptr<Schedule> Schedule::create(const config::Job& job, int world_size) {
  config::check_world(job, world_size);
  const int64_t T = job.model.tasks;
  THETAD_CHECK(T >= 1 && T <= config::kMaxTasks, InternalError, "schedule: model.tasks ", T,
               " outside [1, ", config::kMaxTasks, "]: the job was not validated");
  THETAD_CHECK(job.data.batch_per_rank >= 1, InternalError, "schedule: data.batch_per_rank ",
               job.data.batch_per_rank, " < 1: the job was not validated");

  std::unique_ptr<Schedule> s(new Schedule());
  s->kind_ = job.data.schedule;
  s->train_shared_ = job.model.train_shared;
  s->num_tasks_ = static_cast<int>(T);
  s->world_ = world_size;
  s->seed_ = job.seed;
  s->batch_ = job.data.batch_per_rank;
  s->tasks_per_rank_ = job.data.tasks_per_rank;
  switch (s->kind_) {
    case Kind::RoundRobin:
    case Kind::Weighted: {
      const int64_t k = s->tasks_per_rank_;
      THETAD_CHECK(k >= 1 && k <= config::kMaxTasksPerRank, InternalError,
                   "schedule: data.tasks_per_rank ", k, " outside [1, ", config::kMaxTasksPerRank, "]");
      if (s->kind_ == Kind::Weighted) {
        const std::vector<double>& w = job.data.weights;
        THETAD_CHECK_EQ(static_cast<int64_t>(w.size()), T, "schedule: one weight per task");
        double sum = 0;
        for (double x : w) sum += x;
        THETAD_CHECK(sum > 0 && std::isfinite(sum), InternalError, "schedule: weights sum to ", sum);
        s->cumulative_.resize(w.size());
        double acc = 0;
        size_t last_positive = 0;
        for (size_t i = 0; i < w.size(); ++i) {
          acc += w[i] / sum;
          s->cumulative_[i] = acc;
          if (w[i] > 0) last_positive = i;
        }
        // Rounding must never leave a gap above the last positive weight, and tasks of
        // weight 0 after it must stay unreachable.
        for (size_t i = last_positive; i < w.size(); ++i) s->cumulative_[i] = 1.0;
      }
      break;
    }
    case Kind::PerRank:
      for (const auto& list : job.data.per_rank) {
        std::vector<int> tasks(list.begin(), list.end());
        std::sort(tasks.begin(), tasks.end());
        s->per_rank_.push_back(std::move(tasks));
      }
      break;
    case Kind::All:
      break;
    case Kind::Alternate:
      s->alternate_ = job.data.alternate_entries;
      THETAD_CHECK(!s->alternate_.empty(), InternalError,
                   "schedule: no data.alternate_entries (load_job fills them)");
      break;
  }
  return s;
}

void Schedule::check_args(int64_t step, int rank) const {
  THETAD_CHECK(step >= 0, InternalError, "schedule: negative step ", step);
  THETAD_CHECK(rank >= 0 && rank < world_, InternalError, "schedule: rank ", rank,
               " outside world of ", world_);
}

int Schedule::weighted_pick(int64_t step, int rank, int64_t j) const {
  // Counter-based: chaining splitmix64 over (seed, step, rank, j) gives independent-looking
  // draws that any rank can recompute for any step without sharing state.
  uint64_t h = splitmix64(seed_);
  h = splitmix64(h ^ static_cast<uint64_t>(step));
  h = splitmix64(h ^ static_cast<uint64_t>(rank));
  h = splitmix64(h ^ static_cast<uint64_t>(j));
  const double u = static_cast<double>(h >> 11) * 0x1.0p-53;  // [0, 1)
  auto it = std::upper_bound(cumulative_.begin(), cumulative_.end(), u);
  if (it == cumulative_.end()) --it;  // unreachable (last == 1 > u); defensive
  return static_cast<int>(it - cumulative_.begin());
}

std::vector<std::pair<int, int64_t>> Schedule::draw(int64_t step, int rank) const {
  draws_.fetch_add(1, std::memory_order_relaxed);
  const int64_t T = num_tasks_;
  std::vector<int> tasks;
  switch (kind_) {
    case Kind::RoundRobin: {
      // tasks ((s*W + r)*k + j) mod T, j < k, computed in modular arithmetic so that no step
      // number can overflow.
      const int64_t base = mod(mulmod(step, world_, T) + rank, T);
      const int64_t k = tasks_per_rank_;
      const int64_t start = mulmod(base, k, T);
      for (int64_t j = 0; j < std::min(k, T); ++j) tasks.push_back(static_cast<int>(mod(start + j, T)));
      break;
    }
    case Kind::Weighted: {
      // Rows are split over the k draws, so a task drawn twice gets twice the rows.
      const auto rows = split_rows(batch_, tasks_per_rank_);
      std::vector<std::pair<int, int64_t>> out;
      for (int64_t j = 0; j < tasks_per_rank_; ++j)
        out.emplace_back(weighted_pick(step, rank, j), rows[static_cast<size_t>(j)]);
      return out;
    }
    case Kind::PerRank:
      tasks = per_rank_[static_cast<size_t>(rank)];
      break;
    case Kind::All:
    case Kind::Alternate:
      for (int t = 0; t < num_tasks_; ++t) tasks.push_back(t);
      break;
  }
  std::sort(tasks.begin(), tasks.end());
  tasks.erase(std::unique(tasks.begin(), tasks.end()), tasks.end());
  const auto rows = split_rows(batch_, static_cast<int64_t>(tasks.size()));
  std::vector<std::pair<int, int64_t>> out;
  for (size_t i = 0; i < tasks.size(); ++i) out.emplace_back(tasks[i], rows[i]);
  return out;
}

StepPlan Schedule::plan(int64_t step, int rank) const {
  check_args(step, rank);
  std::map<int, int64_t> rows;  // ordered: tasks come out ascending, duplicates merged
  for (const auto& [task, n] : draw(step, rank)) rows[task] += n;

  StepPlan p;
  p.trained.assign(static_cast<size_t>(num_groups()), 0);
  p.used.assign(static_cast<size_t>(num_groups()), 0);
  for (const auto& [task, n] : rows) {
    p.tasks.push_back(task);
    p.task_rows.push_back(n);
    p.used[static_cast<size_t>(task) + 1] = 1;
  }
  p.used[0] = 1;

  if (kind_ != Kind::Alternate) {
    p.trained = p.used;  // everything in the forward is trained, Θ included
    p.trained[0] = train_shared_ ? 1 : 0;
    return p;
  }
  // alternate: the whole model runs, one entry's groups are trained, the others frozen.
  const config::AlternateEntry& e = alternate_[static_cast<size_t>(mod(step, static_cast<int64_t>(alternate_.size())))];
  switch (e.kind) {
    case config::AlternateEntry::Kind::Shared: p.trained[0] = 1; break;
    case config::AlternateEntry::Kind::Task: p.trained[static_cast<size_t>(e.task) + 1] = 1; break;
    case config::AlternateEntry::Kind::Tasks:
      for (int g = 1; g < num_groups(); ++g) p.trained[static_cast<size_t>(g)] = 1;
      break;
  }
  if (!train_shared_) p.trained[0] = 0;
  return p;
}

int64_t Schedule::max_tasks_per_plan() const {
  int64_t most = num_tasks_;  // all, alternate: every task
  if (kind_ == Kind::RoundRobin || kind_ == Kind::Weighted) most = std::min<int64_t>(tasks_per_rank_, num_tasks_);
  if (kind_ == Kind::PerRank) {
    most = 0;
    for (std::vector<int> list : per_rank_) {  // sorted at create(); a task listed twice is one
      list.erase(std::unique(list.begin(), list.end()), list.end());
      most = std::max<int64_t>(most, static_cast<int64_t>(list.size()));
    }
  }
  return most;
}

std::vector<int> Schedule::tasks_at(int64_t step, int rank) const {
  check_args(step, rank);
  std::vector<int> tasks;
  for (const auto& d : draw(step, rank)) tasks.push_back(d.first);
  std::sort(tasks.begin(), tasks.end());
  tasks.erase(std::unique(tasks.begin(), tasks.end()), tasks.end());
  return tasks;
}

std::vector<uint8_t> Schedule::window_task_groups(int64_t step, int64_t micro_steps, int rank) const {
  std::vector<uint8_t> used(static_cast<size_t>(num_groups()), 0);
  for (int64_t m = 0; m < micro_steps; ++m)
    for (int t : tasks_at(step * micro_steps + m, rank)) used[static_cast<size_t>(t) + 1] = 1;
  return used;
}

std::vector<uint8_t> Schedule::task_groups_used_before(int64_t end) const {
  std::vector<uint8_t> used(static_cast<size_t>(num_groups()), 0);
  int64_t count = 0;
  for (int64_t s = 0; s < end && count < num_tasks_; ++s)
    for (int r = 0; r < world_; ++r)
      for (int t : tasks_at(s, r)) {
        uint8_t& u = used[static_cast<size_t>(t) + 1];
        count += u == 0;
        u = 1;
      }
  return used;
}

int64_t Schedule::next_use(int task, int64_t after_step, int rank, int64_t horizon) const {
  check_args(std::max<int64_t>(after_step, 0), rank);
  if (task < 0 || task >= num_tasks_ || horizon < 1) return INT64_MAX;
  if (after_step == INT64_MAX) return INT64_MAX;
  // Steps are >= 0, so the first candidate is max(after_step + 1, 0).
  const int64_t first = after_step < 0 ? 0 : after_step + 1;
  const int64_t last = (after_step > INT64_MAX - horizon) ? INT64_MAX : after_step + horizon;
  if (first > last) return INT64_MAX;

  switch (kind_) {
    case Kind::All:
    case Kind::Alternate:
      return first;
    case Kind::PerRank: {
      const auto& l = per_rank_[static_cast<size_t>(rank)];
      return std::binary_search(l.begin(), l.end(), task) ? first : INT64_MAX;
    }
    case Kind::RoundRobin:
    case Kind::Weighted:
      break;
  }
  // round_robin repeats with period T (shifting s by T shifts the index by T*W*k ≡ 0 mod T).
  int64_t span = last - first;
  if (kind_ == Kind::RoundRobin) span = std::min<int64_t>(span, num_tasks_ - 1);
  for (int64_t s = first; s - first <= span; ++s) {
    const auto tasks = tasks_at(s, rank);
    if (std::binary_search(tasks.begin(), tasks.end(), task)) return s;
    if (s == INT64_MAX) break;
  }
  return INT64_MAX;
}

std::vector<int> Schedule::contributors(int64_t step) const {
  std::vector<int> c(static_cast<size_t>(num_groups()), 0);
  for (int r = 0; r < world_; ++r) {
    const StepPlan p = plan(step, r);
    for (size_t g = 0; g < c.size(); ++g) c[g] += p.trained[g];
  }
  return c;
}

}  // namespace thetad::daemon
