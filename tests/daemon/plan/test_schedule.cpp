// Schedule formulas against hand-computed tables (T = 5; W = 2, 3), determinism, batch
// splitting, next_use and the world-size check. The checks of the data section itself are
// config's (tests/config/test_schedule_checks.cpp holds the bad jobs this file used to feed
// Schedule::create).
#include <gtest/gtest.h>

#include <climits>
#include <map>

#include "common/errors.hpp"
#include "daemon/plan/schedule.hpp"
#include "tests/daemon/test_util.hpp"

namespace thetad::daemon {
namespace {

using Tasks = std::vector<int>;
using Rows = std::vector<int64_t>;
using Groups = std::vector<uint8_t>;

config::Job make_job(const std::string& schedule, int64_t tasks = 5, int64_t batch = 10) {
  return test::schedule_job(schedule, tasks, batch);
}

// data.alternate and the entries load_job parses from it.
void set_alternate(config::Job& job, const std::vector<std::string>& words) {
  job.data.alternate = words;
  job.data.alternate_entries.clear();
  for (const auto& w : words) {
    config::AlternateEntry e;
    EXPECT_TRUE(config::AlternateEntry::parse(w, e)) << w;
    job.data.alternate_entries.push_back(e);
  }
}

// Checks the invariants every plan must satisfy, whatever the kind.
void check_invariants(const StepPlan& p, int T, int64_t batch) {
  ASSERT_EQ(p.tasks.size(), p.task_rows.size());
  ASSERT_EQ(p.trained.size(), static_cast<size_t>(T + 1));
  ASSERT_EQ(p.used.size(), static_cast<size_t>(T + 1));
  int64_t sum = 0;
  for (size_t i = 0; i < p.tasks.size(); ++i) {
    if (i) {
      EXPECT_LT(p.tasks[i - 1], p.tasks[i]) << "tasks not ascending/unique";
    }
    EXPECT_GE(p.tasks[i], 0);
    EXPECT_LT(p.tasks[i], T);
    EXPECT_GT(p.task_rows[i], 0);
    EXPECT_TRUE(p.used[static_cast<size_t>(p.tasks[i]) + 1]);
    sum += p.task_rows[i];
  }
  EXPECT_EQ(sum, batch);
  for (int g = 0; g <= T; ++g) EXPECT_LE(p.trained[static_cast<size_t>(g)], p.used[static_cast<size_t>(g)]);
  EXPECT_TRUE(p.used[0]);
}

Groups groups_of(const Tasks& tasks, int T, bool shared = true) {
  Groups g(static_cast<size_t>(T + 1), 0);
  g[0] = shared ? 1 : 0;
  for (int t : tasks) g[static_cast<size_t>(t) + 1] = 1;
  return g;
}

TEST(Schedule, RoundRobinW2) {
  auto s = Schedule::create(make_job("round_robin"), 2);
  // (s*2 + r) mod 5
  const int expect[6][2] = {{0, 1}, {2, 3}, {4, 0}, {1, 2}, {3, 4}, {0, 1}};
  for (int step = 0; step < 6; ++step) {
    for (int r = 0; r < 2; ++r) {
      const StepPlan p = s->plan(step, r);
      check_invariants(p, 5, 10);
      EXPECT_EQ(p.tasks, Tasks{expect[step][r]}) << "step " << step << " rank " << r;
      EXPECT_EQ(p.task_rows, Rows{10});
      EXPECT_EQ(p.trained, groups_of(p.tasks, 5));
      EXPECT_EQ(p.used, p.trained);
      EXPECT_EQ(s->tasks_at(step, r), p.tasks);
    }
  }
}

// offload.host_groups: scheduled: the task groups any rank uses before a micro-step.
TEST(Schedule, TaskGroupsUsedBefore) {
  auto s = Schedule::create(make_job("round_robin"), 2);
  using Flags = std::vector<uint8_t>;
  EXPECT_EQ(s->task_groups_used_before(0), (Flags{0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(s->task_groups_used_before(1), (Flags{0, 1, 1, 0, 0, 0}));  // tasks 0, 1
  EXPECT_EQ(s->task_groups_used_before(2), (Flags{0, 1, 1, 1, 1, 0}));  // and 2, 3
  EXPECT_EQ(s->task_groups_used_before(100), (Flags{0, 1, 1, 1, 1, 1}));
}

TEST(Schedule, RoundRobinW3) {
  auto s = Schedule::create(make_job("round_robin"), 3);
  // (s*3 + r) mod 5
  const int expect[5][3] = {{0, 1, 2}, {3, 4, 0}, {1, 2, 3}, {4, 0, 1}, {2, 3, 4}};
  for (int step = 0; step < 5; ++step)
    for (int r = 0; r < 3; ++r)
      EXPECT_EQ(s->tasks_at(step, r), Tasks{expect[step][r]}) << "step " << step << " rank " << r;
  EXPECT_EQ(s->contributors(0), (std::vector<int>{3, 1, 1, 1, 0, 0}));
  EXPECT_EQ(s->contributors(1), (std::vector<int>{3, 1, 0, 0, 1, 1}));
}

TEST(Schedule, RoundRobinTasksPerRank) {
  auto job = make_job("round_robin", 5, 7);
  job.data.tasks_per_rank = 2;
  auto s = Schedule::create(job, 2);
  // ((s*2 + r)*2 + j) mod 5, j < 2, sorted; 7 rows -> 4 + 3 (remainder to the first task).
  EXPECT_EQ(s->plan(0, 0).tasks, (Tasks{0, 1}));
  EXPECT_EQ(s->plan(0, 1).tasks, (Tasks{2, 3}));
  EXPECT_EQ(s->plan(1, 0).tasks, (Tasks{0, 4}));
  EXPECT_EQ(s->plan(1, 1).tasks, (Tasks{1, 2}));
  EXPECT_EQ(s->plan(2, 0).tasks, (Tasks{3, 4}));
  EXPECT_EQ(s->plan(2, 1).tasks, (Tasks{0, 1}));
  EXPECT_EQ(s->plan(1, 0).task_rows, (Rows{4, 3}));
  for (int step = 0; step < 10; ++step)
    for (int r = 0; r < 2; ++r) check_invariants(s->plan(step, r), 5, 7);

  job.data.tasks_per_rank = 3;
  job.data.batch_per_rank = 10;
  auto s3 = Schedule::create(job, 3);
  EXPECT_EQ(s3->plan(0, 0).tasks, (Tasks{0, 1, 2}));
  EXPECT_EQ(s3->plan(0, 0).task_rows, (Rows{4, 3, 3}));
  EXPECT_EQ(s3->plan(0, 1).tasks, (Tasks{0, 3, 4}));
  EXPECT_EQ(s3->plan(0, 2).tasks, (Tasks{1, 2, 3}));
  EXPECT_EQ(s3->plan(1, 0).tasks, (Tasks{0, 1, 4}));  // index 3 -> 9,10,11 mod 5 = 4,0,1

  // More tasks per rank than tasks: deduplicated to all of them, rows split evenly.
  job.data.tasks_per_rank = 7;
  auto s7 = Schedule::create(job, 2);
  EXPECT_EQ(s7->plan(3, 1).tasks, (Tasks{0, 1, 2, 3, 4}));
  EXPECT_EQ(s7->plan(3, 1).task_rows, (Rows{2, 2, 2, 2, 2}));
}

TEST(Schedule, AllSplitsBatch) {
  auto s = Schedule::create(make_job("all", 5, 12), 3);
  for (int r = 0; r < 3; ++r) {
    const StepPlan p = s->plan(7, r);
    check_invariants(p, 5, 12);
    EXPECT_EQ(p.tasks, (Tasks{0, 1, 2, 3, 4}));
    EXPECT_EQ(p.task_rows, (Rows{3, 3, 2, 2, 2}));
    EXPECT_EQ(p.trained, Groups(6, 1));
  }
  EXPECT_EQ(s->contributors(0), (std::vector<int>(6, 3)));
}

TEST(Schedule, PerRank) {
  auto job = make_job("per_rank", 5, 9);
  job.data.per_rank = {{2, 0}, {4}};
  auto s = Schedule::create(job, 2);
  for (int step : {0, 1, 17}) {
    EXPECT_EQ(s->plan(step, 0).tasks, (Tasks{0, 2}));
    EXPECT_EQ(s->plan(step, 0).task_rows, (Rows{5, 4}));
    EXPECT_EQ(s->plan(step, 1).tasks, (Tasks{4}));
    EXPECT_EQ(s->plan(step, 1).trained, (Groups{1, 0, 0, 0, 0, 1}));
  }
}

TEST(Schedule, PerRankWorldMismatchNamesKey) {
  auto job = make_job("per_rank");
  job.data.per_rank = {{0}, {1}};
  try {
    Schedule::create(job, 3);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("data.per_rank"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3 ranks"), std::string::npos) << msg;
    EXPECT_NE(msg.find("test.yaml"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(Schedule::create(job, 2));
  // Tasks out of range, empty lists and duplicates: config's ScheduleChecks.PerRank* tests.
}

TEST(Schedule, Alternate) {
  auto job = make_job("alternate", 5, 10);
  set_alternate(job, {"shared", "task:2", "tasks"});
  auto s = Schedule::create(job, 2);
  const Groups expect[4] = {{1, 0, 0, 0, 0, 0}, {0, 0, 0, 1, 0, 0}, {0, 1, 1, 1, 1, 1}, {1, 0, 0, 0, 0, 0}};
  for (int step = 0; step < 4; ++step) {
    for (int r = 0; r < 2; ++r) {
      const StepPlan p = s->plan(step, r);
      check_invariants(p, 5, 10);
      EXPECT_EQ(p.tasks, (Tasks{0, 1, 2, 3, 4}));
      EXPECT_EQ(p.used, Groups(6, 1));
      EXPECT_EQ(p.trained, expect[step]) << "step " << step;
    }
  }
  EXPECT_EQ(s->contributors(1), (std::vector<int>{0, 0, 0, 2, 0, 0}));
  EXPECT_EQ(s->next_use(3, 10, 1, 5), 11);  // the whole model runs every step
  // Bad and missing entries: config's ScheduleChecks.AlternateEntries.
}

// The documented RNG: chained splitmix64 over (seed, step, rank, j), 53-bit uniform,
// first task whose cumulative weight exceeds it.
int reference_pick(uint64_t seed, int64_t step, int rank, int64_t j, const std::vector<double>& w) {
  uint64_t h = splitmix64(seed);
  h = splitmix64(h ^ static_cast<uint64_t>(step));
  h = splitmix64(h ^ static_cast<uint64_t>(rank));
  h = splitmix64(h ^ static_cast<uint64_t>(j));
  const double u = static_cast<double>(h >> 11) / 9007199254740992.0;
  double sum = 0, acc = 0;
  for (double x : w) sum += x;
  for (size_t t = 0; t < w.size(); ++t) {
    acc += w[t] / sum;
    if (u < acc) return static_cast<int>(t);
  }
  return static_cast<int>(w.size()) - 1;
}

TEST(Schedule, WeightedMatchesReferenceAndWeights) {
  auto job = make_job("weighted", 5, 10);
  job.data.weights = {1, 0, 2, 0, 1};
  job.data.tasks_per_rank = 2;
  auto s = Schedule::create(job, 3);
  std::map<int, int> counts;
  for (int step = 0; step < 2000; ++step) {
    for (int r = 0; r < 3; ++r) {
      const StepPlan p = s->plan(step, r);
      check_invariants(p, 5, 10);
      // Rows: 5 per draw; a task drawn twice gets 10.
      std::map<int, int64_t> expect;
      for (int j = 0; j < 2; ++j) expect[reference_pick(1234, step, r, j, job.data.weights)] += 5;
      ASSERT_EQ(p.tasks.size(), expect.size());
      size_t i = 0;
      for (const auto& [t, rows] : expect) {
        EXPECT_EQ(p.tasks[i], t);
        EXPECT_EQ(p.task_rows[i], rows);
        ++i;
      }
      for (size_t k = 0; k < p.tasks.size(); ++k) counts[p.tasks[k]] += static_cast<int>(p.task_rows[k] / 5);
    }
  }
  EXPECT_EQ(counts[1], 0);
  EXPECT_EQ(counts[3], 0);
  const double total = counts[0] + counts[2] + counts[4];
  EXPECT_NEAR(counts[0] / total, 0.25, 0.03);
  EXPECT_NEAR(counts[2] / total, 0.50, 0.03);
  EXPECT_NEAR(counts[4] / total, 0.25, 0.03);

  // Trailing zero weights stay unreachable; a single positive weight is always drawn.
  job.data.weights = {0, 1, 0, 0, 0};
  auto one = Schedule::create(job, 2);
  for (int step = 0; step < 100; ++step) EXPECT_EQ(one->tasks_at(step, 1), (Tasks{1}));
}

TEST(Schedule, DeterministicAndSeeded) {
  auto job = make_job("weighted", 5, 8);
  job.data.weights = {1, 1, 1, 1, 1};
  job.data.tasks_per_rank = 3;
  auto a = Schedule::create(job, 2);
  auto b = Schedule::create(job, 2);
  // Evaluation order does not matter: the plan is a pure function of (seed, step, rank).
  for (int step = 49; step >= 0; --step)
    for (int r = 1; r >= 0; --r) {
      EXPECT_EQ(a->plan(step, r).tasks, b->plan(step, r).tasks);
      EXPECT_EQ(a->plan(step, r).task_rows, b->plan(step, r).task_rows);
    }
  job.seed = 99;
  auto c = Schedule::create(job, 2);
  int differ = 0;
  for (int step = 0; step < 50; ++step) differ += a->tasks_at(step, 0) != c->tasks_at(step, 0);
  EXPECT_GT(differ, 10);
  // Huge step numbers must not overflow.
  EXPECT_EQ(a->tasks_at(INT64_MAX - 1, 1), b->tasks_at(INT64_MAX - 1, 1));
  auto rr = Schedule::create(make_job("round_robin"), 3);
  const int64_t big = INT64_MAX - 4;  // ≡ 3 mod 5: (3*3 + 2) mod 5 = 1
  EXPECT_EQ(rr->tasks_at(big, 2), Tasks{1});
}

TEST(Schedule, NextUse) {
  auto s = Schedule::create(make_job("round_robin"), 2);
  // rank 0 trains 0,2,4,1,3,0,2,4,1,3,... at steps 0,1,2,...
  EXPECT_EQ(s->next_use(1, 0, 0, 10), 3);
  EXPECT_EQ(s->next_use(1, 3, 0, 10), 8);
  EXPECT_EQ(s->next_use(1, 0, 0, 2), INT64_MAX);  // outside the horizon
  EXPECT_EQ(s->next_use(1, 0, 0, 3), 3);
  EXPECT_EQ(s->next_use(0, -1, 0, 1), 0);         // step 0 itself
  EXPECT_EQ(s->next_use(0, 0, 0, 1000000000), 5); // periodicity bounds the scan
  EXPECT_EQ(s->next_use(7, 0, 0, 10), INT64_MAX); // no such task
  EXPECT_EQ(s->next_use(0, INT64_MAX, 0, 100), INT64_MAX);  // no step after the last one
  for (int task = 0; task < 5; ++task) {  // the window is clamped, never overflows
    const int64_t n = s->next_use(task, INT64_MAX - 10, 0, 100);
    EXPECT_TRUE(n == INT64_MAX || (n > INT64_MAX - 10 && n <= INT64_MAX - 5)) << n;
  }

  auto job = make_job("per_rank");
  job.data.per_rank = {{0, 2}, {4}};
  auto p = Schedule::create(job, 2);
  EXPECT_EQ(p->next_use(2, 41, 0, 1), 42);
  EXPECT_EQ(p->next_use(4, 41, 0, 100), INT64_MAX);

  // weighted: agrees with a brute-force scan of tasks_at.
  auto wj = make_job("weighted");
  wj.data.weights = {1, 1, 1, 1, 4};
  auto w = Schedule::create(wj, 3);
  for (int task = 0; task < 5; ++task) {
    int64_t brute = INT64_MAX;
    for (int64_t st = 11; st <= 40; ++st) {
      const Tasks ts = w->tasks_at(st, 2);
      if (std::find(ts.begin(), ts.end(), task) != ts.end()) {
        brute = st;
        break;
      }
    }
    EXPECT_EQ(w->next_use(task, 10, 2, 30), brute) << "task " << task;
  }
}

// Bad jobs are validate's (config's ScheduleChecks.ValidationErrors); what is left here is
// misuse of the API, an InternalError: no world, a job that was never validated, bad arguments.
TEST(Schedule, InternalMisuse) {
  EXPECT_THROW(Schedule::create(make_job("round_robin"), 0), InternalError);
  EXPECT_THROW(Schedule::create(make_job("round_robin", 0), 2), InternalError);
  EXPECT_THROW(Schedule::create(make_job("weighted"), 2), InternalError);  // no weights
  EXPECT_THROW(Schedule::create(make_job("alternate"), 2), InternalError);  // no entries
  auto s = Schedule::create(make_job("round_robin"), 2);
  EXPECT_THROW(s->plan(0, 2), InternalError);
  EXPECT_THROW(s->plan(-1, 0), InternalError);
}

TEST(Schedule, SplitRows) {
  EXPECT_EQ(split_rows(10, 3), (Rows{4, 3, 3}));
  EXPECT_EQ(split_rows(9, 3), (Rows{3, 3, 3}));
  EXPECT_EQ(split_rows(5, 1), (Rows{5}));
  EXPECT_TRUE(split_rows(5, 0).empty());
}

}  // namespace
}  // namespace thetad::daemon
