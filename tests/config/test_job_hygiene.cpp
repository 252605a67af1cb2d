// a job file is read with a bound (/dev/zero is
// refused at once), binary junk is never echoed raw, a duplicate key inside a --set names the
// argument, outputs on one path and per-rank outputs without {rank} are refused before any
// step, and keys without effect under the job's choices are warnings naming file:line:key.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "config/loader.hpp"
#include "job_test_util.hpp"

namespace thetad::config {
namespace {

using test::contains;
using test::error_of;
using test::kMinimal;

TEST(JobFile, DevZeroIsRefusedPromptly) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    load_job("/dev/zero");
    FAIL() << "accepted /dev/zero";
  } catch (const JobError& e) {
    EXPECT_TRUE(contains(e.what(), "/dev/zero: cannot read job file: not a regular file (a character device)")) << e.what();
    EXPECT_EQ(exit_code_for(e), kExitBadInput);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

// a FIFO blocks open() until a writer comes; it is refused before opening.
TEST(JobFile, FifoIsRefusedBeforeOpening) {
  const std::string fifo = testing::TempDir() + "thetad-job-fifo-" + std::to_string(::getpid());
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  std::string what = "(accepted)";
  try {
    load_job(fifo);
  } catch (const JobError& e) {
    what = e.what();
    EXPECT_EQ(exit_code_for(e), kExitBadInput);
  }
  ::unlink(fifo.c_str());
  EXPECT_TRUE(contains(what, fifo + ": cannot read job file: not a regular file (a FIFO)")) << what;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(JobFile, BinaryJunkIsNotEchoedRaw) {
  const std::string junk = std::string("steps: 10\n\x1b[2J\x07\x01:\xff\xfe junk: 1\n", 25);
  const std::string what = error_of(junk);
  ASSERT_NE(what, "(accepted)");
  for (const char c : what) {
    const auto u = static_cast<unsigned char>(c);
    EXPECT_FALSE((u < 0x20 && c != '\n') || u == 0x7f || u >= 0x80) << "raw byte " << int(u) << " in: " << what;
  }
}

TEST(JobFile, DuplicateKeyInSetNamesTheArgument) {
  LoadOptions opts;
  opts.overrides = {"optimizer={lr: 0.1, lr: 0.2}"};
  const std::string what = error_of(kMinimal, opts);
  EXPECT_TRUE(contains(what, "--set optimizer.lr: duplicate key (given twice in --set 'optimizer={lr: 0.1, lr: 0.2}')"))
      << what;
  EXPECT_FALSE(contains(what, "line 0")) << what;
}

TEST(JobFile, OutputsOnOnePathAreRefused) {
  const std::string what = error_of(kMinimal + "metrics: {path: out/m.jsonl}\ntimeline: {path: out/m.jsonl}\n");
  EXPECT_TRUE(contains(what, "job.yaml:5:")) << what;
  EXPECT_TRUE(contains(what, "timeline.path: is the same path as metrics.path ('out/m.jsonl')")) << what;
  const std::string ckpt = error_of(kMinimal + "checkpoint: {dir: out/x}\nlog: {file: out/x}\n");
  EXPECT_TRUE(contains(ckpt, "log.file: is the same path as checkpoint.dir")) << ckpt;
}

// a file inside checkpoint.dir is replaced by a checkpoint or moved aside.
TEST(JobFile, OutputsInsideTheCheckpointDirAreRefused) {
  const std::string what = error_of(kMinimal + "checkpoint: {dir: out/ck}\nmetrics: {path: out/ck/../ck/m.jsonl}\n");
  EXPECT_TRUE(contains(what, "job.yaml:5:")) << what;
  EXPECT_TRUE(contains(what, "metrics.path: 'out/ck/../ck/m.jsonl' lies inside checkpoint.dir ('out/ck')")) << what;
  const std::string log = error_of(kMinimal + "job: j\ncheckpoint: {dir: 'runs/{job}'}\nlog: {file: 'runs/j/{rank}.log'}\n");
  EXPECT_TRUE(contains(log, "log.file: 'runs/j/{rank}.log' lies inside checkpoint.dir")) << log;
  EXPECT_EQ(error_of(kMinimal + "checkpoint: {dir: out/ck}\nmetrics: {path: out/ck2/m.jsonl}\n"), "(accepted)");
  EXPECT_EQ(error_of(kMinimal + "checkpoint: {dir: out/ck}\nmetrics: {path: out/m.jsonl}\n"), "(accepted)");
}

// a size product that an override breaks is blamed on the override, not on
// the file's line of another factor.
TEST(JobFile, ProductLimitBlamesTheOverride) {
  LoadOptions opts;
  opts.overrides = {"model.d_model=16777216"};
  const std::string what = error_of(
      "steps: 1\nmodel: {kind: transformer, vocab: 50000, d_model: 64, heads: 1}\ndata: {}\n", opts);
  EXPECT_TRUE(contains(what, "--set model.d_model: the largest parameter of transformer")) << what;
  EXPECT_FALSE(contains(what, "job.yaml:2")) << what;
  LoadOptions tasks;
  tasks.overrides = {"model.hidden=16777216"};
  const std::string mlp = error_of("steps: 1\nmodel: {kind: multitask_mlp, input_dim: 4096, tasks: 2}\ndata: {}\n", tasks);
  EXPECT_TRUE(contains(mlp, "--set model.hidden: the largest parameter")) << mlp;
}

TEST(JobFile, PerRankOutputsNeedRankOnSeveralRanks) {
  const Job job = load_job_from_string(kMinimal + "timeline: {path: out/trace.json}\nlog: {file: out/log.txt}\n",
                                       "job.yaml");
  EXPECT_NO_THROW(check_world(job, 1));
  try {
    check_world(job, 2);
    FAIL();
  } catch (const JobError& e) {
    ASSERT_EQ(e.messages().size(), 2u) << e.what();
    EXPECT_TRUE(contains(e.messages()[0], "job.yaml: timeline.path: 'out/trace.json' has no {rank} but the world has 2 ranks"))
        << e.what();
    EXPECT_TRUE(contains(e.messages()[1], "job.yaml: log.file: 'out/log.txt' has no {rank}")) << e.what();
  }
  const Job ok = load_job_from_string(kMinimal + "timeline: {path: \"out/trace-{rank}.json\"}\n", "job.yaml");
  EXPECT_NO_THROW(check_world(ok, 4));
}

TEST(JobFile, KeysWithoutEffectAreWarnings) {
  const Job job = load_job_from_string(
      "steps: 10\nmodel: {kind: multitask_mlp, classes: 100}\n"
      "data:\n  kind: synthetic\n  dir: /data\n  weights: [1, 2, 3, 4]\n"
      "offload: {device_slots: 2}\noptimizer: {kind: sgd, eps: 1.0e-6}\n",
      "job.yaml");
  const std::string all = [&] {
    std::string s;
    for (const auto& w : job.warnings) s += w + "\n";
    return s;
  }();
  EXPECT_EQ(job.warnings.size(), 5u) << all;
  EXPECT_TRUE(contains(all, "job.yaml:2:30: model.classes: ignored: model.kind is multitask_mlp (used by extreme_classifier)")) << all;
  EXPECT_TRUE(contains(all, "job.yaml:5:3: data.dir: ignored: data.kind is synthetic (used by npy and tokens)")) << all;
  EXPECT_TRUE(contains(all, "job.yaml:6:3: data.weights: ignored: data.schedule is round_robin (used by weighted)")) << all;
  EXPECT_TRUE(contains(all, "offload.device_slots: ignored: offload.enabled is false")) << all;
  EXPECT_TRUE(contains(all, "optimizer.eps: ignored: optimizer.kind is sgd")) << all;
  EXPECT_TRUE(load_job_from_string(kMinimal, "job.yaml").warnings.empty());
}

// A train.KEY enum: `def` without the key, `value` from `word`, and a `bad` word refused at its line
// with the allowed words listed.
template <typename Enum, typename Field>
void expect_train_enum(const std::string& key, Field field, Enum def, const std::string& word, Enum value,
                       const std::string& bad, const std::string& allowed) {
  EXPECT_EQ(load_job_from_string(kMinimal, "job.yaml").train.*field, def) << key;
  EXPECT_EQ(load_job_from_string(kMinimal + "train: {" + key + ": " + word + "}\n", "job.yaml").train.*field, value)
      << key;
  const std::string what = error_of(kMinimal + "train: {" + key + ": " + bad + "}\n");
  EXPECT_TRUE(contains(what, "job.yaml:4:")) << what;
  EXPECT_TRUE(contains(what, "train." + key + ": must be one of " + allowed)) << what;
}

TEST(JobFile, OnNonfiniteIsAPolicy) {
  expect_train_enum("on_nonfinite", &TrainConfig::on_nonfinite, NonFinite::Stop, "skip_step", NonFinite::SkipStep,
                    "skip", "stop, skip_step, warn");
}

TEST(JobFile, BackwardIsAutoJointOrPerTask) {
  expect_train_enum("backward", &TrainConfig::backward, Backward::Auto, "per_task", Backward::PerTask, "per-task",
                    "auto, joint, per_task");
}

}  // namespace
}  // namespace thetad::config
