// The window plans (daemon/plan/window_plan): each micro-step's plan as the schedule gives it for
// every schedule kind, the window's used and trained groups, and the cache: each (window, rank)
// drawn from the schedule once, whoever asks (the trainer, the store's look-ahead over one rank or
// every rank, the replica rule), until the run has moved past it.
#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "config/job.hpp"
#include "daemon/plan/window_plan.hpp"
#include "tests/daemon/test_util.hpp"

namespace thetad::daemon {
namespace {

config::Job job_of(const std::string& schedule, int64_t tasks, int64_t tasks_per_rank = 1) {
  config::Job job = test::schedule_job(schedule, tasks, /*batch=*/8);
  job.data.tasks_per_rank = tasks_per_rank;
  return job;
}

std::vector<config::Job> every_kind() {
  std::vector<config::Job> jobs{job_of("round_robin", 7, 2), job_of("weighted", 5, 3), job_of("all", 4)};
  jobs[1].data.weights = {1, 0, 2, 3, 0.5};
  config::Job per_rank = job_of("per_rank", 5);
  per_rank.data.per_rank = {{2, 0}, {4}, {1, 3}};
  jobs.push_back(per_rank);
  config::Job alternate = job_of("alternate", 5);
  using Entry = config::AlternateEntry;
  alternate.data.alternate = {"shared", "task:2", "tasks"};
  alternate.data.alternate_entries = {{Entry::Kind::Shared, -1}, {Entry::Kind::Task, 2}, {Entry::Kind::Tasks, -1}};
  jobs.push_back(alternate);
  config::Job frozen = job_of("round_robin", 6, 2);
  frozen.model.train_shared = false;
  jobs.push_back(frozen);
  return jobs;
}

// A window's micro-steps are the schedule's plans, bit for bit; its used and trained groups are
// their unions (Θ among them), and its task groups are what Schedule::window_task_groups says.
TEST(WindowPlan, IsTheScheduleSPlansOfItsMicroSteps) {
  for (const config::Job& job : every_kind()) {
    for (int64_t k : {1, 3}) {
      auto schedule = Schedule::create(job, 3);
      WindowPlans plans(*schedule, k);
      for (int64_t w : {0, 1, 5, 12})
        for (int r = 0; r < 3; ++r) {
          const auto plan = plans.at(w, r);
          ASSERT_EQ(plan->micro_steps(), k);
          std::set<int> used, trained;
          for (int64_t m = 0; m < k; ++m) {
            const StepPlan want = schedule->plan(w * k + m, r);
            const StepPlan got = plan->step_plan(m);
            EXPECT_EQ(got.tasks, want.tasks);
            EXPECT_EQ(got.task_rows, want.task_rows);
            EXPECT_EQ(got.used, want.used);
            EXPECT_EQ(got.trained, want.trained);
            for (size_t g = 0; g < want.used.size(); ++g) {
              if (want.used[g]) used.insert(static_cast<int>(g));
              if (want.trained[g]) trained.insert(static_cast<int>(g));
            }
          }
          EXPECT_EQ(plan->used, std::vector<int>(used.begin(), used.end()));
          EXPECT_EQ(plan->trained, std::vector<int>(trained.begin(), trained.end()));
          const std::vector<uint8_t> dense = schedule->window_task_groups(w, k, r);
          std::vector<int> task_groups;
          for (size_t g = 1; g < dense.size(); ++g)
            if (dense[g]) task_groups.push_back(static_cast<int>(g));
          EXPECT_EQ(plan->task_groups(), task_groups);
          EXPECT_EQ(plans.task_groups(w, r, r), task_groups);
          for (int g = 0; g < schedule->num_groups(); ++g) {
            EXPECT_EQ(plan->reads(g), used.count(g) == 1);
            EXPECT_EQ(plan->trains(g), trained.count(g) == 1);
          }
        }
    }
  }
}

// Each (window, rank) is drawn once: k draws of the schedule, whoever asks and however often.
TEST(WindowPlans, EachWindowAndRankIsComputedOnce) {
  const config::Job job = job_of("round_robin", 9, 2);
  const int64_t k = 2;
  const int world = 4;
  auto schedule = Schedule::create(job, world);
  WindowPlans plans(*schedule, k);
  const int64_t before = schedule->draws();
  for (int round = 0; round < 3; ++round)
    for (int64_t w = 0; w < 10; ++w) {
      plans.at(w, 1);                      // the trainer of rank 1
      plans.task_groups(w, 1, 1);          // its store's slots and prefetch
      plans.task_groups(w, 0, world - 1);  // the device cache's placement
      plans.all_ranks(w);                  // the replica rule
    }
  EXPECT_EQ(plans.computed(), 10 * world);
  EXPECT_EQ(schedule->draws() - before, 10 * world * k);
  // Union over ranks: what each rank's plan says.
  std::set<int> any;
  for (int r = 0; r < world; ++r)
    for (int g : plans.at(3, r)->task_groups()) any.insert(g);
  EXPECT_EQ(plans.task_groups(3, 0, world - 1), std::vector<int>(any.begin(), any.end()));
  EXPECT_EQ(schedule->draws() - before, 10 * world * k);  // still nothing new
}

// The run moving on drops the windows behind it (but those a reader keeps behind); a window asked
// for again after it went is drawn again.
TEST(WindowPlans, ForgetsWindowsTheRunHasPassed) {
  const config::Job job = job_of("round_robin", 5);
  auto schedule = Schedule::create(job, 2);
  WindowPlans plans(*schedule, 1);
  for (int64_t w = 0; w < 8; ++w) plans.at(w, 0);
  plans.advance(5);
  EXPECT_EQ(plans.computed(), 8);
  plans.at(6, 0);
  EXPECT_EQ(plans.computed(), 8);
  plans.at(4, 0);  // gone: drawn again
  EXPECT_EQ(plans.computed(), 9);
  plans.keep_behind(3);
  plans.advance(6);  // keeps windows 3.. (4 is there)
  plans.at(4, 0);
  EXPECT_EQ(plans.computed(), 9);
}

// The store's look-ahead may read plans on other threads while the trainer asks for the current one.
TEST(WindowPlans, SafeFromSeveralThreads) {
  const config::Job job = job_of("weighted", 6, 2);
  config::Job weighted = job;
  weighted.data.weights = {1, 1, 1, 1, 1, 1};
  auto schedule = Schedule::create(weighted, 3);
  WindowPlans plans(*schedule, 2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&plans] {
      for (int64_t w = 0; w < 50; ++w) plans.task_groups(w, 0, 2);
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(plans.computed(), 50 * 3);
  EXPECT_EQ(schedule->draws(), 50 * 3 * 2);
}

TEST(WindowPlans, WindowsPastTheLastMicroStepTouchNothing) {
  const config::Job job = job_of("round_robin", 5);
  auto schedule = Schedule::create(job, 1);
  WindowPlans plans(*schedule, 4);
  const auto far = plans.at(std::numeric_limits<int64_t>::max() / 2, 0);
  EXPECT_EQ(far->micro_steps(), 0);
  EXPECT_TRUE(far->used.empty());
  EXPECT_FALSE(far->reads(0));
}

}  // namespace
}  // namespace thetad::daemon
