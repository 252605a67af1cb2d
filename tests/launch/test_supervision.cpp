// The launcher's state machine without processes: a stop signal, a second stop, SIGQUIT and
// mpirun/srun's end at every phase; the rank-count wait; srun ending before its tasks; and the
// verdict and line cutting that follow.
#include <gtest/gtest.h>

#include <csignal>

#include "launch/log_merge.hpp"
#include "launch/summary.hpp"
#include "launch/supervision.hpp"

namespace thetad::launch {
namespace {

Supervision::Config config(int ranks = 2, int nodes = 1) {
  Supervision::Config c;
  c.ranks = ranks;
  c.nodes = nodes;
  c.launcher = "srun";
  c.start_wait_s = 10;
  c.drain_wait_s = 120;
  return c;
}

bool has(const Actions& a, Action::Kind k) {
  for (const auto& x : a)
    if (x.kind == k) return true;
  return false;
}

int code_of(const Actions& a, Action::Kind k) {
  for (const auto& x : a)
    if (x.kind == k) return x.code;
  return -1;
}

// A machine driven to `p`.
Supervision at(Phase p, int ranks = 2, int nodes = 1) {
  Supervision s(config(ranks, nodes));
  if (p == Phase::Preparing) return s;
  EXPECT_TRUE(has(s.on_ready_to_launch(0), Action::Launch));
  if (p == Phase::Running) return s;
  s.on_signal(SIGTERM, 1);
  if (p == Phase::StopPending) return s;
  EXPECT_TRUE(has(s.on_ranks_started(ranks, 1), Action::StopRanks));
  if (p == Phase::Stopping) return s;
  EXPECT_TRUE(s.on_launcher_exit(143, 2).empty());
  if (p == Phase::Draining) return s;
  s.on_local_ranks(0, 3);
  return s;
}

const Phase kPhases[] = {Phase::Preparing, Phase::Running, Phase::StopPending,
                         Phase::Stopping, Phase::Draining, Phase::Done};

TEST(Supervision, StopBeforeLaunchStartsNothingAndExits4) {
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    Supervision s(config());
    EXPECT_TRUE(s.on_signal(sig, 0).empty());
    Actions a = s.on_ready_to_launch(1);
    EXPECT_FALSE(has(a, Action::Launch));
    EXPECT_EQ(code_of(a, Action::Exit), 4);
    EXPECT_EQ(s.phase(), Phase::Done);
  }
}

TEST(Supervision, StopWaitsUntilEveryRankIsUp) {
  Supervision s = at(Phase::Running, 4);
  Actions a = s.on_signal(SIGINT, 1);
  ASSERT_TRUE(has(a, Action::Log));
  EXPECT_NE(a[0].text.find("SIGINT: asking every rank"), std::string::npos);
  EXPECT_TRUE(s.wants_rank_count());
  EXPECT_TRUE(s.on_ranks_started(3, 100).empty());  // one node: waits as long as it takes
  EXPECT_TRUE(has(s.on_ranks_started(4, 101), Action::StopRanks));
  EXPECT_EQ(s.phase(), Phase::Stopping);
  EXPECT_TRUE(s.on_ranks_started(4, 102).empty());  // sent once
}

TEST(Supervision, SeveralNodesWaitBoundedForWrappersUp) {
  Supervision s = at(Phase::Running, 4, 2);
  s.on_signal(SIGTERM, 0);
  EXPECT_TRUE(s.on_ranks_started(2, 9.9).empty());
  EXPECT_TRUE(has(s.on_ranks_started(2, 10.0), Action::StopRanks));
}

TEST(Supervision, EverySignalAtEveryPhase) {
  for (Phase p : kPhases)
    for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR2}) {
      SCOPED_TRACE(std::string(phase_name(p)) + " " + std::to_string(sig));
      Supervision s = at(p);
      const bool stopped_before = s.stop_requested();
      Actions a = s.on_signal(sig, 5);
      if (sig == SIGUSR2) {
        EXPECT_TRUE(a.empty());
        EXPECT_EQ(s.phase(), p);
      } else if (sig == SIGQUIT) {
        EXPECT_EQ(code_of(a, Action::Exit), p == Phase::Done ? -1 : 1);
        EXPECT_EQ(s.phase(), Phase::Done);
      } else if (p == Phase::Running) {
        EXPECT_EQ(s.phase(), Phase::StopPending);
      } else {
        EXPECT_EQ(s.phase(), p);  // a later stop changes nothing
        EXPECT_FALSE(has(a, Action::StopRanks));
        EXPECT_EQ(s.stop_requested(), stopped_before || p == Phase::Preparing);
      }
    }
}

TEST(Supervision, RepeatedStopsAreAnnouncedOnce) {
  Supervision s = at(Phase::Stopping);
  Actions a = s.on_signal(SIGTERM, 3);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_NE(a[0].text.find("already stopping"), std::string::npos);
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(s.on_signal(i % 2 ? SIGINT : SIGTERM, 3).empty());
  EXPECT_EQ(s.phase(), Phase::Stopping);
}

// A rank dying makes mpirun/srun end: its end at every phase.
TEST(Supervision, LauncherEndsAtEveryPhase) {
  for (Phase p : kPhases)
    for (int code : {0, 1, 3, 137, 143}) {
      SCOPED_TRACE(std::string(phase_name(p)) + " code " + std::to_string(code));
      Supervision s = at(p);
      Actions a = s.on_launcher_exit(code, 5);
      switch (p) {
        case Phase::Preparing:
        case Phase::Draining:
        case Phase::Done:
          EXPECT_TRUE(a.empty());
          EXPECT_EQ(s.phase(), p);
          break;
        case Phase::Running:
          EXPECT_EQ(code_of(a, Action::Summarize), code);
          break;
        case Phase::StopPending:  // ended before every wrapper was up: stop this host's anyway
          EXPECT_TRUE(has(a, Action::StopRanks));
          [[fallthrough]];
        case Phase::Stopping:
          if (code > 128) {
            EXPECT_EQ(s.phase(), Phase::Draining);
          } else {
            EXPECT_EQ(code_of(a, Action::Summarize), code);
          }
          break;
      }
    }
}

TEST(Supervision, SrunEndingBeforeItsTasksWaitsForThem) {
  Supervision s = at(Phase::Stopping);
  EXPECT_TRUE(s.on_launcher_exit(143, 10).empty());
  ASSERT_EQ(s.phase(), Phase::Draining);
  Actions a = s.on_local_ranks(2, 10.1);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_NE(a[0].text.find("srun ended (code 143) before every rank of this host"), std::string::npos);
  EXPECT_TRUE(s.on_local_ranks(1, 11).empty());  // announced once
  a = s.on_local_ranks(0, 12);
  EXPECT_EQ(code_of(a, Action::Summarize), 143);
  EXPECT_EQ(s.phase(), Phase::Done);
}

TEST(Supervision, DrainGivesUpAfterItsLimit) {
  Supervision s = at(Phase::Draining);
  Actions a = s.on_local_ranks(1, 2 + 120);
  EXPECT_TRUE(has(a, Action::Summarize));
  EXPECT_NE(a[0].text.find("not waiting longer"), std::string::npos);
}

TEST(Summary, FirstFailureByTimeAndLostWrapper) {
  SummaryInput in;
  in.ranks_total = 3;
  in.log_dir = "/l";
  in.ranks[0] = {true, 3, 20.0, false, "n0"};
  in.ranks[1] = {true, 1, 10.0, false, "n0"};
  in.ranks[2] = {true, 0, 5.0, false, "n0"};
  Verdict v = summarize(in);
  EXPECT_EQ(v.code, 1);
  EXPECT_NE(v.lines[0].find("rank 1 exited with code 1 (error)"), std::string::npos);
  // A wrapper killed: no exit record, its pid file left; mpirun's 137 names the signal.
  in.ranks[2] = {false, 0, 0, true, "n0"};
  in.launcher_code = 137;
  v = summarize(in);
  EXPECT_EQ(v.code, 3);
  EXPECT_NE(v.lines[0].find("rank 2 lost (signal 9, SIGKILL)"), std::string::npos);
  EXPECT_NE(v.lines[1].find("node n0 lost rank 2; ranks 0,1 stopped because of it (its ranks: 0,1,2)"),
            std::string::npos)
      << v.lines[1];
}

TEST(Summary, OrderOfEndsNamesTheCauseNotMpirunsCleanup) {
  SummaryInput in;
  in.ranks_total = 4;
  in.log_dir = "/l";
  in.simulated = true;
  in.launcher_code = 137;
  // Node 1's ranks 2 and 3 killed (their wrappers record 137); mpirun then kills the wrappers of
  // ranks 0 and 1, which record nothing.
  in.ranks[0] = {false, 0, 0, true, "0"};
  in.ranks[1] = {false, 0, 0, true, "0"};
  in.ranks[2] = {true, 137, 5.0, false, "1"};
  in.ranks[3] = {true, 137, 5.1, false, "1"};
  in.closed_order = {3, 2, 0, 1};
  Verdict v = summarize(in);
  EXPECT_EQ(v.code, 3);
  EXPECT_NE(v.lines[0].find("rank 3 lost (signal 9, SIGKILL)"), std::string::npos);
  EXPECT_NE(v.lines[1].find("simulated node 1 lost ranks 2,3 (its ranks: 2,3)"), std::string::npos);
  // Rank 1's wrapper killed first; rank 0 then stopped by mpirun's SIGTERM (exit 4).
  in.ranks.clear();
  in.ranks[0] = {true, 4, 9.0, false, "0"};
  in.ranks[1] = {false, 0, 0, true, "0"};
  in.closed_order = {1, 0};
  v = summarize(in);
  EXPECT_NE(v.lines[0].find("rank 1 lost (signal 9, SIGKILL)"), std::string::npos);
  // the node lost rank 1 only; rank 0 was stopped because of it.
  EXPECT_NE(v.lines[1].find("simulated node 0 lost rank 1; rank 0 stopped because of it (its ranks: 0,1)"),
            std::string::npos)
      << v.lines[1];
  // The same with rank 0's wrapper killed by mpirun's cleanup (no exit record).
  in.ranks[0] = {false, 0, 0, true, "0"};
  v = summarize(in);
  EXPECT_NE(v.lines[1].find("simulated node 0 lost rank 1; rank 0 stopped because of it"), std::string::npos)
      << v.lines[1];
}

TEST(Summary, StopAndNeverRan) {
  SummaryInput in;
  in.ranks_total = 2;
  in.launcher_code = 143;
  in.stopped = true;
  EXPECT_EQ(summarize(in).code, 4);
  in.stopped = false;
  EXPECT_EQ(summarize(in).code, 3);
  in.launcher_code = 0;
  in.ranks[0] = {true, 0, 1.0, false, ""};
  EXPECT_EQ(summarize(in).code, 3);  // rank 1 never ran
  in.ranks[1] = {true, 0, 1.0, false, ""};
  EXPECT_EQ(summarize(in).code, 0);
}

TEST(LineBuffer, WholeLinesOnlyAndTheLastOneAtTheEnd) {
  LineBuffer b;
  EXPECT_EQ(b.feed("ab", 2), "");
  EXPECT_EQ(b.feed("c\nde", 4), "abc\n");
  EXPECT_EQ(b.feed("f\ng\n", 4), "def\ng\n");
  EXPECT_EQ(b.feed("tail", 4), "");
  EXPECT_EQ(b.finish(), "tail\n");
  EXPECT_EQ(b.finish(), "");
}

TEST(LineBuffer, TagsEveryLineThatLacksItsOwnRanksTag) {
  EXPECT_EQ(tag_lines("x\n[t] [rank 3] y\n[rank ] z\n", 7),
            "[rank 7] x\n[rank 7] [t] [rank 3] y\n[rank 7] [rank ] z\n");
  EXPECT_EQ(tag_lines("[t] [rank 3] y\n[rank 3] w\n", 3), "[t] [rank 3] y\n[rank 3] w\n");
}

}  // namespace
}  // namespace thetad::launch
