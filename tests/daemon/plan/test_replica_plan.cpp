// The replica rule (daemon/plan/replica_plan): its cost model, the pure decision over hand-made
// use sequences, the decisions over real schedules (round_robin with W dividing T or not,
// per_rank, alternate, gradient accumulation, 8 ranks), the holder record's moves, and a
// simulation of many random schedules in which every rank that reads or steps a group must hold
// its newest state, and every replica is current after make_all_current.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>

#include "daemon/plan/placement.hpp"
#include "daemon/plan/replica_plan.hpp"
#include "tests/daemon/test_util.hpp"

namespace thetad::daemon {
namespace {

constexpr int64_t kHorizon = 64;

config::Job job_of(const std::string& schedule, int64_t tasks, int64_t tasks_per_rank = 1) {
  config::Job job = test::schedule_job(schedule, tasks, /*batch=*/8);
  job.data.tasks_per_rank = tasks_per_rank;
  return job;
}

GroupUse sole(int rank, int trains = 1) { return {1, trains, rank}; }
GroupUse many(int readers, int trainers) { return {readers, trainers, -1}; }

// A use sequence from a table (windows past its end touch nothing).
std::function<GroupUse(int64_t)> seq(std::vector<GroupUse> uses) {
  return [uses](int64_t w) { return w < static_cast<int64_t>(uses.size()) ? uses[static_cast<size_t>(w)] : GroupUse{}; };
}

const ReplicaDecision kSend{ReplicaMode::send, -1};
const ReplicaDecision kNone{ReplicaMode::none, -1};
ReplicaDecision keep(int r) { return {ReplicaMode::keep, r}; }

TEST(ReplicaRule, CostModel) {
  EXPECT_EQ(min_kept_run({4, 12}), 4);  // fp32 gradients, Adam state: 4 x 4 > 12
  EXPECT_EQ(min_kept_run({2, 12}), 7);  // bf16 gradients: 7 x 2 > 12
  EXPECT_EQ(min_kept_run({4, 4}), 2);   // SGD: values only
  EXPECT_EQ(min_kept_run({2, 4}), 3);
  config::Job job = job_of("round_robin", 4);
  EXPECT_EQ(replica_costs(job).gradient, 4);
  EXPECT_EQ(replica_costs(job).state, 12);
  job.comm.grad_dtype = config::GradDtype::Bf16;
  job.optimizer.kind = config::OptimizerKind::Sgd;
  EXPECT_EQ(replica_costs(job).gradient, 2);
  EXPECT_EQ(replica_costs(job).state, 4);
}

TEST(ReplicaRule, NobodyTrainsOrSeveralDo) {
  EXPECT_EQ(decide_replica(seq({{}}), 0, 4, kHorizon), kNone);
  EXPECT_EQ(decide_replica(seq({sole(0, 0)}), 0, 4, kHorizon), kNone);  // read, not trained
  EXPECT_EQ(decide_replica(seq({many(2, 2)}), 0, 1, kHorizon), kSend);
  EXPECT_EQ(decide_replica(seq({many(2, 1)}), 0, 1, kHorizon), kSend);  // another rank reads it
}

TEST(ReplicaRule, OneUserForeverKeeps) {
  const auto always1 = [](int64_t) { return sole(1); };
  for (int64_t w : {0, 1, 5, 1000}) EXPECT_EQ(decide_replica(always1, w, 4, kHorizon), keep(1)) << w;
}

TEST(ReplicaRule, UsersTakingTurnsSend) {
  const auto turns = [](int64_t w) { return sole(static_cast<int>(w % 2)); };
  for (int64_t w = 0; w < 10; ++w) EXPECT_EQ(decide_replica(turns, w, 4, kHorizon), kSend) << w;
  // Every window but one user's: a run of 1.
  const auto mostly = [](int64_t w) { return w % 3 == 0 ? sole(0) : many(2, 2); };
  EXPECT_EQ(decide_replica(mostly, 3, 2, kHorizon), kSend);
}

// A run's windows all get one answer: keep from min_run trained windows, send below.
TEST(ReplicaRule, EveryWindowOfARunAgrees) {
  for (int len = 1; len <= 6; ++len) {
    std::vector<GroupUse> uses = {sole(2), sole(2)};  // rank 2's run before
    for (int i = 0; i < len; ++i) uses.push_back(sole(0));
    uses.push_back(sole(1));                          // rank 1 next
    for (int w = 2; w < 2 + len; ++w)
      EXPECT_EQ(decide_replica(seq(uses), w, 4, kHorizon), len >= 4 ? keep(0) : kSend) << "run " << len << " window " << w;
  }
}

TEST(ReplicaRule, IdleWindowsDoNotBreakARunReadOnlyOnesDoNotCount) {
  std::vector<GroupUse> uses(40);
  for (int w : {0, 10, 20, 30}) uses[static_cast<size_t>(w)] = sole(3);
  for (int w : {0, 10, 20, 30}) EXPECT_EQ(decide_replica(seq(uses), w, 4, kHorizon), keep(3)) << w;
  EXPECT_EQ(decide_replica(seq(uses), 10, 4, /*horizon=*/9), kSend) << "the horizon cuts the run";
  uses[10] = sole(3, /*trains=*/0);  // read by its user without training: in the run, not counted
  EXPECT_EQ(decide_replica(seq(uses), 20, 4, kHorizon), kSend);
  EXPECT_EQ(decide_replica(seq(uses), 20, 3, kHorizon), keep(3));
}

// The rule over `job`'s schedule on `world` ranks, with the window plans it reads (which hold on to
// the schedule).
struct Rule {
  Rule(const config::Job& job, int world, int64_t micro)
      : schedule(Schedule::create(job, world)),
        windows(*schedule, micro),
        plan(windows, Placement::of(job, world).replica_keepable, replica_costs(job)) {}
  std::unique_ptr<Schedule> schedule;
  WindowPlans windows;
  ReplicaPlan plan;
};

TEST(ReplicaPlanOfSchedule, RoundRobinWDividingTKeepsEveryHead) {
  for (int world : {2, 4, 8}) {
    config::Job job = job_of("round_robin", 16);
    Rule plan_rule(job, world, 1);
    ReplicaPlan& plan = plan_rule.plan;
    for (int64_t w = 0; w < 40; ++w) {
      EXPECT_EQ(plan.decision(w, 0), kSend) << "Θ: every rank trains it";
      for (int r = 0; r < world; ++r) {
        const int task = plan_rule.schedule->tasks_at(w, r)[0];
        EXPECT_EQ(plan.decision(w, task + 1), keep(r)) << "W " << world << " window " << w << " task " << task;
        EXPECT_EQ(plan.readers(w, task + 1), std::vector<int>{r});
      }
    }
  }
}

// The rule reads the run's window plans: its scans around each window draw no (window, rank) twice,
// and the trainer's own plan of a window it decided is already there.
TEST(ReplicaPlanOfSchedule, ReadsEachWindowPlanOnce) {
  config::Job job = job_of("round_robin", 16);
  Rule plan_rule(job, 4, 2);
  ReplicaPlan& plan = plan_rule.plan;
  for (int64_t w = 0; w < 40; ++w)
    for (int g = 0; g < plan.num_groups(); ++g) plan.decision(w, g);
  const int64_t drawn = plan_rule.schedule->draws();
  EXPECT_EQ(drawn, plan_rule.windows.computed() * 2);
  for (int64_t w = 0; w < 40; ++w) plan_rule.windows.at(w, 1);
  EXPECT_EQ(plan_rule.schedule->draws(), drawn);
}

TEST(ReplicaPlanOfSchedule, RoundRobinWNotDividingTSends) {
  config::Job job = job_of("round_robin", 5);
  Rule plan_rule(job, 2, 1);
  ReplicaPlan& plan = plan_rule.plan;
  for (int64_t w = 0; w < 20; ++w)
    for (int g = 1; g <= 5; ++g) {
      const ReplicaDecision d = plan.decision(w, g);
      EXPECT_NE(d.mode, ReplicaMode::keep) << "window " << w << " group " << g << ": its user changes every use";
      EXPECT_EQ(d.mode == ReplicaMode::send, plan.use(w, g).trainers > 0);
    }
}

TEST(ReplicaPlanOfSchedule, PerRankAccumulationAlternateAndSwitches) {
  config::Job job = job_of("per_rank", 3);
  job.data.per_rank = {{0}, {0, 1}, {2}};
  Rule per_rank_rule(job, 3, 1);
  ReplicaPlan& per_rank = per_rank_rule.plan;
  EXPECT_EQ(per_rank.decision(7, 1), kSend);    // task 0: two ranks
  EXPECT_EQ(per_rank.decision(7, 2), keep(1));  // task 1: rank 1 only
  EXPECT_EQ(per_rank.decision(7, 3), keep(2));

  // accumulate_steps 2, T = 4, W = 2: micro-steps 2w and 2w + 1 give rank 0 tasks {0, 2}.
  job = job_of("round_robin", 4);
  Rule accumulate_rule(job, 2, 2);
  ReplicaPlan& accumulate = accumulate_rule.plan;
  EXPECT_EQ(accumulate.decision(3, 1), keep(0));
  EXPECT_EQ(accumulate.decision(3, 3), keep(0));
  EXPECT_EQ(accumulate.decision(3, 2), keep(1));

  job = job_of("alternate", 3);
  job.data.alternate = {"shared", "task:1"};
  job.data.alternate_entries = {{config::AlternateEntry::Kind::Shared, -1}, {config::AlternateEntry::Kind::Task, 1}};
  Rule alternate_rule(job, 2, 1);
  ReplicaPlan& alternate = alternate_rule.plan;
  EXPECT_EQ(alternate.decision(0, 2), kNone);  // read by both, trained by none
  EXPECT_EQ(alternate.decision(1, 2), kSend);  // task 1: both ranks train it
  EXPECT_EQ(alternate.readers(1, 2), (std::vector<int>{0, 1}));

  // The rule off: one rank, comm.sole_user: broadcast, groups in a host store.
  job = job_of("round_robin", 4);
  EXPECT_EQ(Placement::of(job, 1).replica_keepable, std::vector<uint8_t>(5, 0));
  job.comm.sole_user = config::SoleUser::Broadcast;
  EXPECT_EQ(Placement::of(job, 2).replica_keepable, std::vector<uint8_t>(5, 0));
  job.comm.sole_user = config::SoleUser::Keep;
  job.offload.enabled = true;
  EXPECT_EQ(Placement::of(job, 2).replica_keepable, (std::vector<uint8_t>{1, 0, 0, 0, 0}));
  job.offload.shared = config::SharedMode::Stream;
  EXPECT_EQ(Placement::of(job, 2).replica_keepable, std::vector<uint8_t>(5, 0));
  Rule off_rule(job, 2, 1);
  ReplicaPlan& off = off_rule.plan;
  EXPECT_EQ(off.decision(0, 1), kSend);
}

TEST(ReplicaHoldersRecord, MovesWhereTheScheduleNeedsTheState) {
  ReplicaHolders h(3);
  EXPECT_EQ(h.before(1, keep(1), {1}), std::nullopt);  // every replica current
  EXPECT_EQ(h.before_update(1, 1), std::nullopt);
  EXPECT_EQ(h.holder(1), 1);
  EXPECT_EQ(h.before(1, keep(1), {1}), std::nullopt);  // the run goes on
  EXPECT_EQ(h.before_update(1, 1), std::nullopt);
  EXPECT_EQ(h.before(1, keep(0), {0}), (StateMove{1, 1, 0}));  // the next user: point-to-point
  EXPECT_EQ(h.holder(1), 0);
  EXPECT_EQ(h.before_update(1, 0), std::nullopt);
  EXPECT_EQ(h.before(1, kNone, {2}), (StateMove{1, 0, 2}));  // a reader that does not train it
  EXPECT_EQ(h.holder(1), 0);
  EXPECT_EQ(h.before(1, kNone, {1, 2}), (StateMove{1, 0, -1}));  // several readers: a broadcast
  EXPECT_EQ(h.holder(1), -1);
  EXPECT_EQ(h.before_update(1, 2), std::nullopt);
  EXPECT_EQ(h.before(1, kSend, {0, 2}), (StateMove{1, 2, -1}));  // sent: every rank steps it
  EXPECT_EQ(h.before_update(1, -1), std::nullopt);
  EXPECT_EQ(h.holder(1), -1);
  // The counts said otherwise than the decision: every rank steps a stale group.
  EXPECT_EQ(h.before(2, keep(1), {1}), std::nullopt);
  EXPECT_EQ(h.before_update(2, 1), std::nullopt);
  EXPECT_EQ(h.before_update(2, -1), (StateMove{2, 1, -1}));
  EXPECT_EQ(h.before_update(2, 0), std::nullopt);
  EXPECT_EQ(h.make_all_current(), (std::vector<StateMove>{{2, 0, -1}}));
  EXPECT_EQ(h.make_all_current(), std::vector<StateMove>{});
}

// Many random weighted and round_robin schedules on 2..6 ranks: each rank's replica of each group
// has a version; an update makes the updaters' version the newest. Every rank that reads a group
// or steps it must have the newest version, and the moves must be what the record says.
TEST(ReplicaHoldersRecord, SimulatedRunsNeverReadAStaleReplica) {
  std::mt19937 rng(5);
  int64_t kept = 0, moves = 0, sent = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int world = 2 + trial % 5, tasks = 1 + static_cast<int>(rng() % 9);
    config::Job job = job_of(trial % 3 == 0 ? "round_robin" : "weighted", tasks, 1 + trial % 2);
    job.seed = static_cast<uint64_t>(trial);
    job.data.weights.assign(static_cast<size_t>(tasks), 1.0);
    if (trial % 4 == 1) job.data.weights[0] = 30;  // one hot task: longer runs
    if (trial % 5 == 2) job.comm.grad_dtype = config::GradDtype::Bf16;
    const int64_t micro = 1 + trial % 2;
    Rule plan_rule(job, world, micro);
    ReplicaPlan& plan = plan_rule.plan;
    ReplicaHolders holders(tasks + 1);
    std::vector<std::vector<int>> version(static_cast<size_t>(tasks + 1), std::vector<int>(world, 0));
    std::vector<int> newest(static_cast<size_t>(tasks + 1), 0);
    const auto apply = [&](const StateMove& m) {
      auto& v = version[static_cast<size_t>(m.group)];
      ASSERT_EQ(v[static_cast<size_t>(m.from)], newest[static_cast<size_t>(m.group)]) << "moved from a stale replica";
      for (int r = 0; r < world; ++r)
        if (m.to < 0 || r == m.to) v[static_cast<size_t>(r)] = newest[static_cast<size_t>(m.group)];
      ++moves;
    };
    for (int64_t w = 0; w < 30; ++w) {
      for (int g = 1; g <= tasks; ++g) {
        const ReplicaDecision d = plan.decision(w, g);
        const std::vector<int> readers = plan.readers(w, g);
        if (auto m = holders.before(g, d, readers)) apply(*m);
        for (int r : readers)
          ASSERT_EQ(version[static_cast<size_t>(g)][static_cast<size_t>(r)], newest[static_cast<size_t>(g)])
              << "trial " << trial << " window " << w << " group " << g << ": rank " << r << " reads a stale replica";
        if (d.mode == ReplicaMode::none) continue;
        const int kept_by = d.mode == ReplicaMode::keep ? d.keeper : -1;
        if (auto m = holders.before_update(g, kept_by)) apply(*m);
        ++newest[static_cast<size_t>(g)];
        for (int r = 0; r < world; ++r) {
          if (kept_by >= 0 && r != kept_by) continue;  // stale there
          ASSERT_EQ(version[static_cast<size_t>(g)][static_cast<size_t>(r)], newest[static_cast<size_t>(g)] - 1)
              << "trial " << trial << " window " << w << " group " << g << ": rank " << r << " steps a stale replica";
          version[static_cast<size_t>(g)][static_cast<size_t>(r)] = newest[static_cast<size_t>(g)];
        }
        (kept_by >= 0 ? kept : sent) += 1;
      }
    }
    for (const StateMove& m : holders.make_all_current()) apply(m);
    for (int g = 1; g <= tasks; ++g)
      for (int r = 0; r < world; ++r)
        ASSERT_EQ(version[static_cast<size_t>(g)][static_cast<size_t>(r)], newest[static_cast<size_t>(g)]);
  }
  EXPECT_GT(kept, 0) << "no window kept a group: the simulation tests nothing";
  EXPECT_GT(moves, 0);
  EXPECT_GT(sent, 0);
}

}  // namespace
}  // namespace thetad::daemon
