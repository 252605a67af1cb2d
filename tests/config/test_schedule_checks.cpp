// The data-section checks that Schedule::create used to repeat (tests/daemon/test_schedule.cpp
// fed it these jobs): validate is the one place, so each job is rejected by load_job with file,
// line and key. Also the one check that needs the world size (config::check_world), and the
// typed forms load_job derives (enum words, data.alternate entries).
#include <gtest/gtest.h>

#include <string>

#include "config/limits.hpp"
#include "config/loader.hpp"

namespace thetad::config {
namespace {

// The job of test_schedule.cpp's make_job(schedule, tasks, batch), as YAML; `data` appends keys
// to the data section (its lines start at line 7).
std::string job_yaml(const std::string& schedule, int64_t tasks = 5, int64_t batch = 10,
                     const std::string& data = "") {
  return "seed: 1234\nsteps: 100\nmodel: {kind: multitask_mlp, tasks: " + std::to_string(tasks) +
         "}\ndata:\n  schedule: " + schedule + "\n  batch_per_rank: " + std::to_string(batch) +
         "\n" + data;
}

// The messages of the JobError that loading `yaml` throws ("" when it is accepted).
std::string rejection(const std::string& yaml) {
  try {
    load_job_from_string(yaml, "test.yaml");
  } catch (const JobError& e) {
    EXPECT_EQ(exit_code_for(e), kExitBadInput);
    return e.what();
  }
  return "";
}

void expect_rejected(const std::string& yaml, const std::string& want) {
  const std::string what = rejection(yaml);
  EXPECT_NE(what.find(want), std::string::npos) << "want: " << want << "\ngot: " << what
                                                << "\njob:\n" << yaml;
  EXPECT_EQ(what.rfind("test.yaml:", 0), 0u) << what;
}

TEST(ScheduleChecks, PerRankTaskOutOfRangeEmptyOrTwice) {
  expect_rejected(job_yaml("per_rank", 5, 10, "  per_rank: [[0], [5]]\n"),
                  "test.yaml:7:20: data.per_rank[1][0]: task id must be in [0, 5)");
  expect_rejected(job_yaml("per_rank", 5, 10, "  per_rank: [[0], []]\n"),
                  "test.yaml:7:19: data.per_rank[1]: rank 1 has no tasks");
  expect_rejected(job_yaml("per_rank", 5, 10, "  per_rank: [[0, 0], [1]]\n"),
                  "data.per_rank[0][1]: task 0 is listed twice for rank 0");
}

TEST(ScheduleChecks, PerRankNeedsOneListPerRank) {
  const Job job = load_job_from_string(job_yaml("per_rank", 5, 10, "  per_rank: [[0], [1]]\n"), "test.yaml");
  EXPECT_NO_THROW(check_world(job, 2));
  try {
    check_world(job, 3);
    FAIL() << "expected JobError";
  } catch (const JobError& e) {
    EXPECT_EQ(std::string(e.what()),
              "test.yaml: data.per_rank has 2 task lists but the world has 3 ranks (one list per "
              "rank is required)");
  }
  EXPECT_THROW(check_world(job, 0), InternalError);  // no world has no ranks
  EXPECT_NO_THROW(check_world(load_job_from_string(job_yaml("all"), "test.yaml"), 3));
}

TEST(ScheduleChecks, AlternateEntries) {
  for (const char* bad : {"task:5", "task:", "task:-1", "head", "TASKS"}) {
    const std::string what =
        rejection(job_yaml("alternate", 5, 10, std::string("  alternate: [shared, \"") + bad + "\"]\n"));
    EXPECT_NE(what.find("data.alternate[1]"), std::string::npos) << bad << ": " << what;
  }
  expect_rejected(job_yaml("alternate", 5, 10, "  alternate: [shared, \"task:0000000001\"]\n"),
                  "data.alternate[1]: must be 'shared', 'tasks' or 'task:N'");  // 10 digits
  expect_rejected(job_yaml("alternate"), "test.yaml:5:3: data.alternate: schedule 'alternate' needs");

  const Job job = load_job_from_string(
      job_yaml("alternate", 5, 10, "  alternate: [shared, \"task:2\", tasks, \"task:000000004\"]\n"), "t.yaml");
  ASSERT_EQ(job.data.alternate_entries.size(), 4u);
  EXPECT_EQ(job.data.alternate_entries[0].kind, AlternateEntry::Kind::Shared);
  EXPECT_EQ(job.data.alternate_entries[1].kind, AlternateEntry::Kind::Task);
  EXPECT_EQ(job.data.alternate_entries[1].task, 2);
  EXPECT_EQ(job.data.alternate_entries[2].kind, AlternateEntry::Kind::Tasks);
  EXPECT_EQ(job.data.alternate_entries[3].task, 4);
  // Other schedules leave the list as written and unparsed.
  const Job rr = load_job_from_string(job_yaml("round_robin", 5, 10, "  alternate: [head]\n"), "t.yaml");
  EXPECT_TRUE(rr.data.alternate_entries.empty());
}

TEST(ScheduleChecks, ValidationErrors) {
  expect_rejected(job_yaml("random"), "test.yaml:5:3: data.schedule: must be one of round_robin");
  expect_rejected(job_yaml("all", 5, 4), "data.batch_per_rank: is smaller than the 5 tasks");
  expect_rejected(job_yaml("round_robin", 0), "model.tasks: must be > 0, got 0");
  expect_rejected(job_yaml("weighted", 5, 10, "  weights: [1, 2]\n"),
                  "data.weights: needs one weight per task: 5 (model.tasks), got 2");
  expect_rejected(job_yaml("weighted", 5, 10, "  weights: [1, -1, 1, 1, 1]\n"),
                  "data.weights[1]: must be >= 0, got -1");
  expect_rejected(job_yaml("weighted", 5, 10, "  weights: [0, 0, 0, 0, 0]\n"),
                  "data.weights: at least one weight must be > 0");
  expect_rejected(job_yaml("weighted", 5, 10, "  weights: [1.0e308, 1.0e308, 1, 1, 1]\n"),
                  "data.weights: the weights must have a finite sum");
  expect_rejected(job_yaml("weighted"), "data.weights: schedule 'weighted' needs one weight per task");
  expect_rejected(job_yaml("round_robin", 5, 2, "  tasks_per_rank: 3\n"),
                  "data.batch_per_rank: is smaller than the 3 tasks");
  const int64_t many = kMaxTasksPerRank + 1;
  expect_rejected(job_yaml("round_robin", many, many, "  tasks_per_rank: " + std::to_string(many) + "\n"),
                  "data.tasks_per_rank: must be <= 65536");
  EXPECT_EQ(rejection(job_yaml("all", many, many)), "");  // only a draw per task is bounded
}

TEST(Enums, WordsRoundTrip) {
  const Job job = load_job_from_string(
      "steps: 1\nprecision: tf32\nmodel: {kind: extreme_classifier, classes: 8}\n"
      "data: {kind: synthetic, schedule: all}\n"
      "comm: {backend: mpi, average: world, active: discover}\n"
      "optimizer: {kind: sgd, lr_schedule: cosine}\n",
      "t.yaml");
  EXPECT_EQ(job.precision, Precision::Tf32);
  EXPECT_EQ(job.model.kind, ModelKind::ExtremeClassifier);
  EXPECT_EQ(job.data.schedule, ScheduleKind::All);
  EXPECT_EQ(job.comm.backend, Backend::Mpi);
  EXPECT_EQ(job.comm.average, Average::World);
  EXPECT_EQ(job.comm.active, Active::Discover);
  EXPECT_EQ(job.optimizer.kind, OptimizerKind::Sgd);
  EXPECT_EQ(job.optimizer.lr_schedule, LrSchedule::Cosine);
  EXPECT_EQ(to_string(job.model.kind), "extreme_classifier");
  EXPECT_EQ(to_string(ScheduleKind::RoundRobin), "round_robin");
  EXPECT_EQ(to_string(Backend::Auto), "auto");
  OptimizerKind k = OptimizerKind::Sgd;
  EXPECT_TRUE(from_string("adamw", k));
  EXPECT_EQ(k, OptimizerKind::AdamW);
  EXPECT_FALSE(from_string("AdamW", k));
  EXPECT_EQ(k, OptimizerKind::AdamW);
  const std::string fp = fingerprint(job);
  for (const char* line : {"precision=tf32\n", "model.kind=extreme_classifier\n", "data.schedule=all\n",
                           "comm.backend=mpi\n", "comm.average=world\n", "comm.active=discover\n",
                           "optimizer.kind=sgd\n", "optimizer.lr_schedule=cosine\n", "data.kind=synthetic\n"})
    EXPECT_NE(fp.find(line), std::string::npos) << line << "\n" << fp;
}

// An unknown word set over a valid one on the command line is reported; a valid word set over
// an unknown one clears it.
TEST(Enums, OverridesReplaceTheWord) {
  LoadOptions o;
  o.overrides = {"comm.backend=gloo"};
  try {
    load_job_from_string(job_yaml("all"), "t.yaml", o);
    FAIL();
  } catch (const JobError& e) {
    EXPECT_EQ(std::string(e.what()), "--set comm.backend: must be one of auto, mpi, nccl; got 'gloo'");
  }
  o.overrides = {"comm.backend=mpi"};
  EXPECT_EQ(load_job_from_string(job_yaml("all") + "comm: {backend: gloo}\n", "t.yaml", o).comm.backend,
            Backend::Mpi);
}

}  // namespace
}  // namespace thetad::config
