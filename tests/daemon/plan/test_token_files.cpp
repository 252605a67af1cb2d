// The token files a run reads, checked before it starts (daemon/plan/token_files): ids against
// model.vocab with the position of the first one out of range, sizes, uint16 .npy ids refused for
// a larger vocabulary, loss masks of one 0/1 byte per token, and which tasks need files at all
// (the schedule's trained tasks; eval.tasks all, a list, or those trained since the last
// evaluation point).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "config/loader.hpp"
#include "daemon/plan/token_files.hpp"
#include "tests/daemon/test_util.hpp"

namespace thetad::daemon {
namespace {

config::Job job(const std::string& extra) {
  return config::load_job_from_string(
      "steps: 6\nmodel: {kind: transformer, vocab: 300, seq_len: 4, tasks: 4}\n" + extra, "job.yaml");
}

template <typename T>
std::string bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

TEST(TokenFiles, IdsSizesAndMasks) {
  test::ScratchDir dir;
  const config::Job j = job("data: {kind: tokens, dir: /tmp, token_dtype: uint16}\n");
  const std::string f = dir.file("task0.bin");
  test::put(f, bytes(std::vector<uint16_t>{1, 299, 7, 0, 5, 6}));
  const TokenFileFacts facts = scan_token_file(f, j, 5, "task 0's token ids");
  EXPECT_EQ(facts.tokens, 6);
  EXPECT_EQ(facts.max_id, 299);
  test::put(f, bytes(std::vector<uint16_t>{1, 2, 300, 0, 5, 6}));
  test::expect_config_error([&] { scan_token_file(f, j, 5, "x"); }, f, "token id 300 is outside [0, model.vocab = 300) at token 2");
  test::put(f, bytes(std::vector<uint16_t>{1, 2, 3}));
  test::expect_config_error([&] { scan_token_file(f, j, 5, "x"); }, f, "3 tokens, fewer than one window of model.seq_len + 1 = 5");
  test::put(f, "abc");
  test::expect_config_error([&] { scan_token_file(f, j, 1, "x"); }, f, "not a whole number of uint16 token ids");
  test::expect_config_error([&] { scan_token_file(dir.file("task9.bin"), j, 1, "task 9's"); }, "task9.bin", "missing (task 9's)");
  // uint32: ids above 65,535 are read whole.
  const config::Job wide = job("data: {kind: tokens, dir: /tmp, token_dtype: uint32}\n");
  test::put(f, bytes(std::vector<uint32_t>{70000}));
  test::expect_config_error([&] { scan_token_file(f, wide, 1, "x"); }, f, "token id 70000 is outside [0, model.vocab = 300) at token 0");
  // Masks: one byte per token, each 0 or 1.
  const std::string m = dir.file("task0.mask.bin");
  test::put(m, std::string("\1\0\1", 3));
  scan_mask_file(m, 3, "x");
  test::expect_config_error([&] { scan_mask_file(m, 4, "x"); }, m, "3 bytes where its token file has 4 tokens");
  test::put(m, std::string("\1\2\1", 3));
  test::expect_config_error([&] { scan_mask_file(m, 3, "x"); }, m, "byte 1 is 2");
}

// Tasks the schedule never trains need no file: data.weights of 0, a short per_rank run.
TEST(TokenFiles, OnlyTrainedTasksNeedFiles) {
  const config::Job weighted = job("data: {schedule: weighted, weights: [1, 0, 1, 0], tasks_per_rank: 2}\n");
  EXPECT_EQ(tasks_trained(weighted, 2), (std::vector<uint8_t>{1, 0, 1, 0}));
  const config::Job per_rank = job("data: {schedule: per_rank, per_rank: [[3], [0, 1]]}\n");
  EXPECT_EQ(tasks_trained(per_rank, 2), (std::vector<uint8_t>{1, 1, 0, 1}));
  // round_robin on 1 rank for 2 steps: tasks 0 and 1; on 2 ranks: all 4.
  const config::Job rr = config::load_job_from_string(
      "steps: 2\nmodel: {kind: transformer, tasks: 4}\ndata: {}\n", "job.yaml");
  EXPECT_EQ(tasks_trained(rr, 1), (std::vector<uint8_t>{1, 1, 0, 0}));
  EXPECT_EQ(tasks_trained(rr, 2), (std::vector<uint8_t>{1, 1, 1, 1}));
}

TEST(TokenFiles, EvaluatedTasks) {
  const std::string data = "data: {}\n";
  EXPECT_EQ(eval_tasks_at(job(data + "eval: {dir: /tmp}\n"), 1, 6), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(eval_tasks_at(job(data + "eval: {dir: /tmp, tasks: [3, 1]}\n"), 1, 6), (std::vector<int>{1, 3}));
  // scheduled, every 2 steps, round robin on 1 rank: step s trains task s mod 4.
  const config::Job sched = job(data + "eval: {dir: /tmp, tasks: scheduled, every_steps: 2}\n");
  EXPECT_EQ(eval_tasks_at(sched, 1, 2), (std::vector<int>{0, 1}));
  EXPECT_EQ(eval_tasks_at(sched, 1, 4), (std::vector<int>{2, 3}));
  EXPECT_EQ(eval_tasks_at(sched, 1, 6), (std::vector<int>{0, 1}));
  EXPECT_EQ(eval_tasks_at(sched, 1, 5), (std::vector<int>{0}));  // the end of a run of 5: since 4
  EXPECT_EQ(eval_tasks_of_run(sched, 1), (std::vector<int>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace thetad::daemon
