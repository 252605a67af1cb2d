// One optimizer window's plan for one rank, and the one cache of them a run reads: the trainer
// builds the window's plan once and hands it to every home; the host store's look-ahead and the
// replica rule read other ranks' and later windows' plans from the same cache, so that the
// schedule is asked once per (window, rank).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "daemon/plan/schedule.hpp"

namespace thetad::daemon {

// One micro-step of a window, as the schedule drew it: its tasks with their rows and the groups
// it trains (ascending).
struct MicroStep {
  std::vector<int> tasks;
  std::vector<int64_t> task_rows;
  std::vector<int> trained;
};

// What one rank does in optimizer window `window` (its micro-steps window * k + m, m < k).
struct WindowPlan {
  int64_t window = 0;
  int rank = 0;
  int num_groups = 0;
  std::vector<MicroStep> micro;  // empty for a window past the last micro-step that fits in 64 bits
  std::vector<int> used;         // groups some micro-step's forward reads, ascending (Θ, group 0, too)
  std::vector<int> trained;      // groups some micro-step trains, ascending

  int64_t micro_steps() const { return static_cast<int64_t>(micro.size()); }
  // Micro-step m as Schedule::plan(window * k + m, rank) gives it.
  StepPlan step_plan(int64_t m) const;
  bool reads(int g) const;
  bool trains(int g) const;
  // The task groups of `used` (Θ left out), ascending.
  std::vector<int> task_groups() const;
};

// The window plans of a run, each (window, rank) computed from the schedule the first time some
// reader asks for it and kept until the run has moved past it. Safe to read from several threads.
class WindowPlans {
 public:
  WindowPlans(const Schedule& schedule, int64_t micro_steps);

  std::shared_ptr<const WindowPlan> at(int64_t window, int rank);
  // Every rank's plan of the window, by rank.
  std::vector<std::shared_ptr<const WindowPlan>> all_ranks(int64_t window);
  // The task groups that ranks [first_rank, last_rank] use in the window, ascending.
  std::vector<int> task_groups(int64_t window, int first_rank, int last_rank);

  // A reader that looks back (the replica rule's scan) keeps that many windows before the current one.
  void keep_behind(int64_t windows);
  // The run is at `window`: the plans of windows before window - keep_behind go.
  void advance(int64_t window);

  // (window, rank) plans computed so far: each once.
  int64_t computed() const;
  const Schedule& schedule() const { return schedule_; }
  int world_size() const { return schedule_.world_size(); }
  int num_groups() const { return schedule_.num_groups(); }
  int64_t micro_steps() const { return micro_steps_; }

 private:
  using Row = std::vector<std::shared_ptr<const WindowPlan>>;  // by rank, filled as asked
  std::shared_ptr<const WindowPlan> locked_at(int64_t window, int rank);
  WindowPlan compute(int64_t window, int rank) const;

  const Schedule& schedule_;
  const int64_t micro_steps_;
  mutable std::mutex mu_;
  std::map<int64_t, Row> cache_;
  int64_t behind_ = 0;
  int64_t computed_ = 0;
};

}  // namespace thetad::daemon
