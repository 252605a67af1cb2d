// A job's outputs kept out of its inputs (daemon/plan/outputs_apart): a merged model into its
// base's directory, an adapter export into the adapters it continues from, a checkpoint inside the
// data, through {task}, {rank}, "..", and a symbolic link; outputs beside the inputs pass.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "config/job.hpp"
#include "daemon/plan/outputs_apart.hpp"
#include "tests/daemon/test_util.hpp"

namespace thetad::daemon {
namespace {

config::Job transformer_job(const test::ScratchDir& dir) {
  config::Job j;
  j.name = "job";
  j.model.kind = config::ModelKind::Transformer;
  j.model.tasks = 3;
  j.model.init_from = dir.file("base");
  j.data.kind = config::DataKind::Tokens;
  j.data.dir = dir.file("data");
  j.eval.dir = dir.file("eval");
  j.lora.init_from = dir.file("adapters/{task}");
  j.export_.adapters_dir = dir.file("out/{task}");
  j.export_.merged_dir = dir.file("merged/{task}");
  j.export_.merged_tasks = {0, 2};
  j.checkpoint.dir = dir.file("ckpt");
  j.metrics.path = dir.file("metrics-{rank}.jsonl");
  return j;
}

TEST(OutputsApart, OutputsBesideTheInputsPass) {
  test::ScratchDir dir;
  std::filesystem::create_directories(dir.file("base"));
  EXPECT_NO_THROW(check_outputs_apart(transformer_job(dir), 4));
}

TEST(OutputsApart, AMergedModelIntoItsBaseIsRefused) {
  test::ScratchDir dir;
  std::filesystem::create_directories(dir.file("base"));
  config::Job j = transformer_job(dir);
  j.export_.merged_dir = dir.file("base");
  j.export_.merged_tasks = {};
  test::expect_config_error([&] { check_outputs_apart(j, 1); }, dir.file("base"),
                            "export.merged_dir is model.init_from");
  j.export_.merged_dir = dir.file("data/../base/merged-{task}");  // inside it, once folded
  j.export_.merged_tasks = {1};
  test::expect_config_error([&] { check_outputs_apart(j, 1); }, "merged-1",
                            "export.merged_dir (task 1) lies inside model.init_from");
}

TEST(OutputsApart, AnExportIntoTheAdaptersItContinuesFromIsRefused) {
  test::ScratchDir dir;
  config::Job j = transformer_job(dir);
  j.export_.adapters_dir = dir.file("adapters/{task}");
  test::expect_config_error([&] { check_outputs_apart(j, 1); }, "adapters/0",
                            "export.adapters_dir (task 0) is lora.init_from (task 0)");
}

TEST(OutputsApart, AnOutputInsideOneRanksDataIsRefused) {
  test::ScratchDir dir;
  config::Job j = transformer_job(dir);
  j.data.dir = dir.file("data-{rank}");
  j.checkpoint.dir = dir.file("data-3/ckpt");
  EXPECT_NO_THROW(check_outputs_apart(j, 3));  // ranks 0..2 read data-0..data-2
  test::expect_config_error([&] { check_outputs_apart(j, 4); }, "data-3/ckpt",
                            "checkpoint.dir lies inside data.dir (rank 3)");
  j.data.kind = config::DataKind::Synthetic;  // data.dir names no input then
  EXPECT_NO_THROW(check_outputs_apart(j, 4));
}

TEST(OutputsApart, ALinkIsFollowed) {
  test::ScratchDir dir;
  std::filesystem::create_directories(dir.file("eval"));
  std::filesystem::create_directory_symlink(dir.file("eval"), dir.file("looks-elsewhere"));
  config::Job j = transformer_job(dir);
  j.metrics.path = dir.file("looks-elsewhere/metrics.jsonl");
  test::expect_config_error([&] { check_outputs_apart(j, 1); }, "looks-elsewhere/metrics.jsonl",
                            "metrics.path lies inside eval.dir");
}

}  // namespace
}  // namespace thetad::daemon
