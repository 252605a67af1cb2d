// The task schedule: which tasks each rank trains at each step, as a pure function of
// (seed, step, rank), so that every rank also knows what the others and future steps need
// (the engine's active-group exchange, the parameter store's prefetch and eviction).
//
// Tasks are numbered 0..T-1; the parameter group of task t is t+1; group 0 is the shared Θ.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/hash.hpp"
#include "config/job.hpp"
#include "config/limits.hpp"

namespace thetad::daemon {

// What one rank does in one step.
struct StepPlan {
  std::vector<int> tasks;          // tasks in this rank's batch this step, ascending
  std::vector<int64_t> task_rows;  // rows of the batch per task (parallel to tasks; sum = batch_per_rank)
  std::vector<uint8_t> trained;    // size T+1: groups that get gradients this step
  std::vector<uint8_t> used;       // size T+1: groups the forward touches (trained ⊆ used;
                                   //   frozen = used && !trained)
};

class Schedule {
 public:
  using Kind = config::ScheduleKind;

  // The schedule of a job that load_job accepted (config/validate.cpp checks the data section;
  // data.alternate_entries is load_job's). Only the world size is checked here, through
  // config::check_world: data.per_rank needs one list per rank (ConfigError naming the key).
  static std::unique_ptr<Schedule> create(const config::Job& job, int world_size);

  // This rank's batch composition and groups at `step` (step >= 0, 0 <= rank < world).
  StepPlan plan(int64_t step, int rank) const;

  // The most tasks plan() gives one rank at any one step (the room of per-step records).
  int64_t max_tasks_per_plan() const;

  // Just plan(step, rank).tasks, without the row split and group vectors.
  std::vector<int> tasks_at(int64_t step, int rank) const;

  // Per group (size T+1): the task groups `rank` uses in optimizer step `step` of `micro_steps`
  // micro-steps (the union of plan(step * micro_steps + m, rank).used; Θ, group 0, not set).
  std::vector<uint8_t> window_task_groups(int64_t step, int64_t micro_steps, int rank) const;

  // Per group (size T+1): whether any rank uses the task group in micro-steps [0, end) (Θ, group
  // 0, is not counted). Stops early once every task is used. For offload.host_groups: scheduled.
  std::vector<uint8_t> task_groups_used_before(int64_t end) const;

  // First step s with after_step < s <= after_step + horizon at which `rank` uses `task`
  // (its θ is in the forward), or INT64_MAX if none in that window. For prefetch and for
  // farthest-next-use eviction. Cost: O(1) for per_rank/all/alternate, O(min(horizon, T))
  // for round_robin (it is periodic in T), O(horizon * tasks_per_rank) for weighted.
  int64_t next_use(int task, int64_t after_step, int rank, int64_t horizon) const;

  // Per group (size T+1): how many ranks train it at `step` — what the engine's count exchange
  // will return when every rank declares its plan (used by tests and sanity checks).
  std::vector<int> contributors(int64_t step) const;

  // (step, rank) compositions drawn so far (plan, tasks_at and what calls them): how often the
  // schedule was asked, for tests that count it.
  int64_t draws() const { return draws_.load(std::memory_order_relaxed); }

  Kind kind() const { return kind_; }
  int num_tasks() const { return num_tasks_; }
  int num_groups() const { return num_tasks_ + 1; }
  int world_size() const { return world_; }

 private:
  Schedule() = default;
  void check_args(int64_t step, int rank) const;
  // (task, rows) pairs for this rank/step before sorting; duplicates allowed.
  std::vector<std::pair<int, int64_t>> draw(int64_t step, int rank) const;
  int weighted_pick(int64_t step, int rank, int64_t j) const;

  Kind kind_ = Kind::RoundRobin;
  int num_tasks_ = 0;
  int world_ = 1;
  uint64_t seed_ = 0;
  int64_t batch_ = 0;
  int64_t tasks_per_rank_ = 1;
  std::vector<double> cumulative_;  // weighted: cumulative normalised weights, last == 1
  std::vector<std::vector<int>> per_rank_;
  std::vector<config::AlternateEntry> alternate_;
  bool train_shared_ = true;  // model.train_shared: false keeps Θ frozen (used, never trained)
  mutable std::atomic<int64_t> draws_{0};
};

// Splits `total` rows into `parts` nearly equal parts, the remainder to the first parts.
std::vector<int64_t> split_rows(int64_t total, int64_t parts);

}  // namespace thetad::daemon
