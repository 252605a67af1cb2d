// Per-task losses on their way to rank 0's record (daemon/observe/task_losses.hpp): packed into a
// fixed number of words per rank, unpacked rank by rank, merged one loss per task; and the
// schedule's bound on the tasks of a plan that sizes the records.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/errors.hpp"
#include "daemon/plan/schedule.hpp"
#include "daemon/observe/task_losses.hpp"

namespace thetad::daemon {
namespace {

TEST(TaskLosses, PackUnpackMerge) {
  const size_t cap = 3;
  // Rank 0: task 5 in two micro-steps; rank 1: tasks 2 and 5; rank 2: nothing this step.
  const std::vector<TaskRowsLoss> r0{{5, 3, 0.25}, {5, 1, 0.75}};
  const std::vector<TaskRowsLoss> r1{{2, 4, std::nextafter(0.1, 1.0), 2.5}, {5, 4, 1.0}};
  std::vector<int64_t> words = pack_task_losses(r0, cap);
  ASSERT_EQ(words.size(), task_loss_words(cap));
  const std::vector<int64_t> w1 = pack_task_losses(r1, cap), w2 = pack_task_losses({}, cap);
  words.insert(words.end(), w1.begin(), w1.end());
  words.insert(words.end(), w2.begin(), w2.end());
  const std::vector<TaskRowsLoss> all = unpack_task_losses(words, 3, cap);
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[2].task, 2);
  EXPECT_EQ(all[2].rows, 4);
  EXPECT_EQ(all[2].loss, std::nextafter(0.1, 1.0));  // bit for bit
  EXPECT_EQ(all[2].kept_grad_sq, 2.5);  // a kept group's squared norm rides along
  EXPECT_EQ(all[3].kept_grad_sq, -1.0);
  const std::vector<TaskLoss> merged = merge_task_losses(all);
  ASSERT_EQ(merged.size(), 2u);
  EXPECT_EQ(merged[0].task, 2);
  EXPECT_EQ(merged[0].loss, std::nextafter(0.1, 1.0));  // one entry: kept exactly
  EXPECT_EQ(merged[1].task, 5);
  EXPECT_DOUBLE_EQ(merged[1].loss, (3 * 0.25 + 1 * 0.75 + 4 * 1.0) / 8);  // weighted by rows
}

TEST(TaskLosses, RefusesWhatDoesNotFit) {
  EXPECT_THROW(pack_task_losses({{0, 1, 1.0}, {1, 1, 1.0}}, 1), InternalError);
  EXPECT_THROW(pack_task_losses({{0, int64_t{1} << 31, 1.0}}, 1), InternalError);
  std::vector<int64_t> words = pack_task_losses({{0, 1, 1.0}}, 1);
  words[0] = 2;  // more entries than the record has room for
  EXPECT_THROW(unpack_task_losses(words, 1, 1), InternalError);
  EXPECT_THROW(unpack_task_losses(words, 2, 1), InternalError);  // words of one rank for two
}

TEST(TaskLosses, ScheduleBoundsTheTasksOfAPlan) {
  config::Job job;
  job.model.tasks = 10;
  job.data.batch_per_rank = 64;
  job.data.tasks_per_rank = 3;
  for (auto kind : {config::ScheduleKind::RoundRobin, config::ScheduleKind::All}) {
    job.data.schedule = kind;
    const auto s = Schedule::create(job, 2);
    size_t most = 0;
    for (int64_t step = 0; step < 50; ++step)
      for (int r = 0; r < 2; ++r) most = std::max(most, s->plan(step, r).tasks.size());
    EXPECT_EQ(static_cast<size_t>(s->max_tasks_per_plan()), most);
  }
  job.data.schedule = config::ScheduleKind::PerRank;
  job.data.per_rank = {{1, 2}, {3, 4, 4, 5}};
  EXPECT_EQ(Schedule::create(job, 2)->max_tasks_per_plan(), 3);
}

}  // namespace
}  // namespace thetad::daemon
