// Window plans and their cache (see window_plan.hpp).
#include "daemon/plan/window_plan.hpp"

#include <algorithm>
#include <limits>

#include "common/errors.hpp"

namespace thetad::daemon {

StepPlan WindowPlan::step_plan(int64_t m) const {
  THETAD_CHECK(m >= 0 && m < micro_steps(), InternalError, "window ", window, " has no micro-step ", m);
  const MicroStep& s = micro[static_cast<size_t>(m)];
  StepPlan p;
  p.tasks = s.tasks;
  p.task_rows = s.task_rows;
  p.used.assign(static_cast<size_t>(num_groups), 0);
  p.trained.assign(static_cast<size_t>(num_groups), 0);
  p.used[0] = 1;
  for (int t : s.tasks) p.used[static_cast<size_t>(t) + 1] = 1;
  for (int g : s.trained) p.trained[static_cast<size_t>(g)] = 1;
  return p;
}

bool WindowPlan::reads(int g) const { return std::binary_search(used.begin(), used.end(), g); }

bool WindowPlan::trains(int g) const { return std::binary_search(trained.begin(), trained.end(), g); }

std::vector<int> WindowPlan::task_groups() const {
  std::vector<int> groups;
  for (int g : used)
    if (g > 0) groups.push_back(g);
  return groups;
}

WindowPlans::WindowPlans(const Schedule& schedule, int64_t micro_steps)
    : schedule_(schedule), micro_steps_(micro_steps) {
  THETAD_CHECK(micro_steps_ >= 1, InternalError, "WindowPlans: ", micro_steps_, " micro-steps");
}

// The schedule's plans of the window's micro-steps, in sparse form. A window past the last
// micro-step index that fits in 64 bits touches nothing.
WindowPlan WindowPlans::compute(int64_t window, int rank) const {
  WindowPlan w;
  w.window = window;
  w.rank = rank;
  w.num_groups = schedule_.num_groups();
  if (window > std::numeric_limits<int64_t>::max() / micro_steps_ - 1) return w;
  std::vector<uint8_t> used(static_cast<size_t>(w.num_groups), 0), trained(used.size(), 0);
  for (int64_t m = 0; m < micro_steps_; ++m) {
    const StepPlan p = schedule_.plan(window * micro_steps_ + m, rank);
    MicroStep s{p.tasks, p.task_rows, {}};
    for (size_t g = 0; g < p.trained.size(); ++g) {
      if (p.used[g]) used[g] = 1;
      if (!p.trained[g]) continue;
      trained[g] = 1;
      s.trained.push_back(static_cast<int>(g));
    }
    w.micro.push_back(std::move(s));
  }
  for (size_t g = 0; g < used.size(); ++g) {
    if (used[g]) w.used.push_back(static_cast<int>(g));
    if (trained[g]) w.trained.push_back(static_cast<int>(g));
  }
  return w;
}

std::shared_ptr<const WindowPlan> WindowPlans::locked_at(int64_t window, int rank) {
  THETAD_CHECK(window >= 0 && rank >= 0 && rank < world_size(), InternalError, "window plan of window ", window,
               ", rank ", rank);
  Row& row = cache_[window];
  row.resize(static_cast<size_t>(world_size()));
  std::shared_ptr<const WindowPlan>& p = row[static_cast<size_t>(rank)];
  if (!p) {
    p = std::make_shared<const WindowPlan>(compute(window, rank));
    ++computed_;
  }
  return p;
}

std::shared_ptr<const WindowPlan> WindowPlans::at(int64_t window, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  return locked_at(window, rank);
}

std::vector<std::shared_ptr<const WindowPlan>> WindowPlans::all_ranks(int64_t window) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<const WindowPlan>> plans;
  for (int r = 0; r < world_size(); ++r) plans.push_back(locked_at(window, r));
  return plans;
}

std::vector<int> WindowPlans::task_groups(int64_t window, int first_rank, int last_rank) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint8_t> any(static_cast<size_t>(num_groups()), 0);
  for (int r = first_rank; r <= last_rank; ++r)
    for (int g : locked_at(window, r)->used) any[static_cast<size_t>(g)] = 1;
  std::vector<int> groups;
  for (size_t g = 1; g < any.size(); ++g)
    if (any[g]) groups.push_back(static_cast<int>(g));
  return groups;
}

void WindowPlans::keep_behind(int64_t windows) {
  std::lock_guard<std::mutex> lock(mu_);
  behind_ = std::max(behind_, windows);
}

void WindowPlans::advance(int64_t window) {
  std::lock_guard<std::mutex> lock(mu_);
  if (window - behind_ <= 0) return;
  cache_.erase(cache_.begin(), cache_.lower_bound(window - behind_));
}

int64_t WindowPlans::computed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return computed_;
}

}  // namespace thetad::daemon
