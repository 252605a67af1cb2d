// Job loading beyond the bad-file table: defaults, all errors at once, `--set` overrides,
// files on disk, to_yaml round trip, the cross-rank fingerprint, path placeholders, examples.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "config/diagnostics.hpp"
#include "config/loader.hpp"
#include "job_test_util.hpp"

namespace thetad::config {
namespace {

namespace fs = std::filesystem;

using test::contains;
using test::error_of;
using test::kMinimal;
using test::TempDir;

TEST(Load, MinimalJobGetsDefaults) {
  const Job job = load_job_from_string(kMinimal, "job.yaml");
  EXPECT_EQ(job.source, "job.yaml");
  EXPECT_EQ(job.steps, 10);
  EXPECT_EQ(job.name, "thetad-job");
  EXPECT_EQ(to_string(job.model.kind), "multitask_mlp");
  EXPECT_EQ(job.model.tasks, 4);
  EXPECT_EQ(to_string(job.data.schedule), "round_robin");
  EXPECT_EQ(to_string(job.comm.backend), "auto");
  EXPECT_DOUBLE_EQ(job.comm.bucket_cap_mb, 25.0);
  EXPECT_DOUBLE_EQ(job.optimizer.beta2, 0.999);
  EXPECT_EQ(job.log.level, "info");
}

TEST(Load, ReadsEveryKindOfValue) {
  const Job job = load_job_from_string(
      "job: \"quoted-name\"\nseed: 18446744073709551615\nsteps: +7\n"
      "model: {kind: multitask_mlp, tasks: 3}\n"
      "data:\n  schedule: per_rank\n  per_rank: [[0, 1], [2]]\n  weights: [1, 2.5, 0]\n"
      "  alternate: [shared, \"task:1\"]\n"
      "comm: {prune: false, bucket_cap_mb: 0.5, first_bucket_mb: 0.25}\n"
      "offload:\n"
      "optimizer: {betas: [0.8, 0.95], lr: 3e-4}\n",
      "job.yaml");
  EXPECT_EQ(job.name, "quoted-name");
  EXPECT_EQ(job.seed, 18446744073709551615ull);
  EXPECT_EQ(job.steps, 7);
  EXPECT_EQ(job.data.per_rank, (std::vector<std::vector<int64_t>>{{0, 1}, {2}}));
  EXPECT_EQ(job.data.weights, (std::vector<double>{1, 2.5, 0}));
  EXPECT_EQ(job.data.alternate, (std::vector<std::string>{"shared", "task:1"}));
  EXPECT_FALSE(job.comm.prune);
  EXPECT_DOUBLE_EQ(job.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(job.optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(job.optimizer.lr, 3e-4);
  EXPECT_FALSE(job.offload.enabled);
}

TEST(Load, ReportsEveryErrorInFileOrder) {
  try {
    load_job_from_string(
        "steps: 0\n"                                   // 1
        "model:\n"                                     // 2
        "  kind: multitask_mlp\n"                      // 3
        "  tasks: -2\n"                                // 4
        "data: {batch_per_rank: 0}\n"                  // 5
        "optimizer: {lr: -1, betas: [0.9, 2], eps: x}\n"  // 6
        "comm: {backend: nccl, timout_s: 3}\n",        // 7
        "job.yaml");
    FAIL() << "accepted";
  } catch (const JobError& e) {
    const auto& m = e.messages();
    ASSERT_EQ(m.size(), 8u) << e.what();
    EXPECT_TRUE(contains(m[0], "job.yaml:1:1: steps:"));
    EXPECT_TRUE(contains(m[1], "job.yaml:4:3: model.tasks:"));
    EXPECT_TRUE(contains(m[2], "job.yaml:5:8: data.batch_per_rank:"));
    EXPECT_TRUE(contains(e.what(), "job.yaml:6:13: optimizer.lr: must be > 0"));
    EXPECT_TRUE(contains(e.what(), "optimizer.betas[1]: beta2 must be in [0, 1), got 2"));
    EXPECT_TRUE(contains(e.what(), "optimizer.eps: expected a number, got 'x'"));
    EXPECT_TRUE(contains(e.what(), "comm.backend:"));
    EXPECT_TRUE(contains(e.what(), "comm.timout_s: unknown key; did you mean 'timeout_s'?"));
    // what() is the messages, one per line.
    EXPECT_EQ(std::count(e.what(), e.what() + std::strlen(e.what()), '\n'), 7);
  }
}

TEST(Load, TypeErrorIsReportedOnce) {
  const std::string err = error_of("steps: many\nmodel: {kind: multitask_mlp}\ndata: {}\n");
  EXPECT_TRUE(contains(err, "steps: expected an integer")) << err;
  EXPECT_FALSE(contains(err, "required")) << err;
  EXPECT_FALSE(contains(err, "must be > 0")) << err;
}

TEST(Load, NcclAcceptedOnCudaBuild) {
  LoadOptions opts;
  opts.cuda_build = true;
  const Job job = load_job_from_string(kMinimal + "comm: {backend: nccl}\n", "job.yaml", opts);
  EXPECT_EQ(to_string(job.comm.backend), "nccl");
}

TEST(Suggest, NearestKnownKey) {
  using detail::nearest;
  EXPECT_EQ(detail::edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(nearest("stpes", {"job", "seed", "steps"}), "steps");
  EXPECT_EQ(nearest("bucket_cap", {"bucket_cap_mb", "first_bucket_mb"}), "bucket_cap_mb");
  EXPECT_EQ(nearest("zzzzzz", {"job", "seed", "steps"}), "");
}

TEST(Suggest, ListsKnownKeysWhenNothingIsClose) {
  const std::string err = error_of(kMinimal + "checkpoint: {frobnicate: 1}\n");
  EXPECT_TRUE(contains(err, "job.yaml:4:14: checkpoint.frobnicate: unknown key; known keys in "
                            "'checkpoint': dir, every_steps, keep")) << err;
}

TEST(Overrides, ApplyBeforeValidation) {
  LoadOptions opts;
  opts.overrides = {"steps=20",
                    "optimizer.betas=[0.9,0.99]",
                    "optimizer.lr=1.0e-2",
                    "log.file={job}-{rank}.log",
                    "model={kind: multitask_adapter, adapter_rank: 4}",
                    "offload.enabled=true",
                    "data.weights=[1, 2, 3, 4]",
                    "data.schedule=weighted",
                    "job=renamed"};
  const Job job = load_job_from_string(kMinimal + "checkpoint: {dir: ck, every_steps: 5}\n",
                                       "job.yaml", opts);
  EXPECT_EQ(job.steps, 20);
  EXPECT_DOUBLE_EQ(job.optimizer.beta2, 0.99);
  EXPECT_DOUBLE_EQ(job.optimizer.lr, 0.01);
  EXPECT_EQ(job.log.file, "{job}-{rank}.log");
  EXPECT_EQ(to_string(job.model.kind), "multitask_adapter");
  EXPECT_EQ(job.model.adapter_rank, 4);
  EXPECT_TRUE(job.offload.enabled);
  EXPECT_EQ(to_string(job.data.schedule), "weighted");
  EXPECT_EQ(job.name, "renamed");
  EXPECT_EQ(expand_path(job.log.file, job, 3), "renamed-3.log");
}

TEST(Overrides, SupplyRequiredKeys) {
  LoadOptions opts;
  opts.overrides = {"steps=5", "model.kind=extreme_classifier", "model.classes=100"};
  const Job job = load_job_from_string("data: {}\n", "job.yaml", opts);
  EXPECT_EQ(job.steps, 5);
  EXPECT_EQ(job.model.classes, 100);
}

TEST(Overrides, FixRangeErrorOfTheFile) {
  LoadOptions opts;
  opts.overrides = {"steps=3"};
  EXPECT_EQ(load_job_from_string("steps: 0\nmodel: {kind: multitask_mlp}\ndata: {}\n", "job.yaml",
                                 opts).steps, 3);
}

TEST(Overrides, EmptyValueClearsString) {
  LoadOptions opts;
  opts.overrides = {"checkpoint.dir=", "checkpoint.every_steps=0"};
  const Job job = load_job_from_string(kMinimal + "checkpoint: {dir: ck, every_steps: 5}\n",
                                       "job.yaml", opts);
  EXPECT_EQ(job.checkpoint.dir, "");
}

TEST(Overrides, UnknownPathIsAnErrorWithSuggestion) {
  LoadOptions opts;
  opts.overrides = {"optimizer.lrr=0.1"};
  EXPECT_EQ(error_of(kMinimal, opts),
            "--set optimizer.lrr: unknown key path; did you mean 'optimizer.lr'?");
  opts.overrides = {"optimiser.lr=0.1"};
  EXPECT_TRUE(contains(error_of(kMinimal, opts), "did you mean 'optimizer.lr'?"));
  opts.overrides = {"a.b.c.d=1"};
  EXPECT_TRUE(contains(error_of(kMinimal, opts), "--set a.b.c.d: unknown key path"));
}

TEST(Overrides, InvalidValues) {
  LoadOptions opts;
  opts.overrides = {"steps=abc"};
  EXPECT_EQ(error_of(kMinimal, opts), "--set steps: expected an integer, got 'abc'");
  opts.overrides = {"optimizer.lr=-1"};
  EXPECT_EQ(error_of(kMinimal, opts), "--set optimizer.lr: must be > 0, got -1");
  opts.overrides = {"optimizer.betas=[0.9, 1.5]"};
  EXPECT_TRUE(contains(error_of(kMinimal, opts), "--set optimizer.betas[1]: beta2 must be in [0, 1)"));
  opts.overrides = {"optimizer.betas=[0.9"};
  EXPECT_TRUE(contains(error_of(kMinimal, opts), "--set optimizer.betas: cannot parse value"));
  opts.overrides = {"comm.prune=maybe"};
  EXPECT_EQ(error_of(kMinimal, opts), "--set comm.prune: expected true or false, got 'maybe'");
  opts.overrides = {"steps"};
  EXPECT_EQ(error_of(kMinimal, opts), "--set steps: expected key.path=value");
  opts.overrides = {"comm.backend=nccl"};
  EXPECT_TRUE(contains(error_of(kMinimal, opts), "--set comm.backend: 'nccl' is not available"));
}

TEST(Overrides, ErrorsComeAfterFileErrors) {
  LoadOptions opts;
  opts.overrides = {"steps=x"};
  try {
    load_job_from_string("steps: 1\nmodel: {kind: multitask_mlp, tasks: 0}\ndata: {}\n",
                         "job.yaml", opts);
    FAIL();
  } catch (const JobError& e) {
    ASSERT_EQ(e.messages().size(), 2u) << e.what();
    EXPECT_EQ(e.messages()[0].rfind("job.yaml:2:", 0), 0u);
    EXPECT_EQ(e.messages()[1].rfind("--set steps:", 0), 0u);
  }
}

TEST_F(TempDir, MissingFileNamesThePath) {
  const std::string path = (dir_ / "nope.yaml").string();
  try {
    load_job(path);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), path + ": cannot read job file")) << e.what();
    EXPECT_EQ(exit_code_for(e), kExitBadInput);
  }
  EXPECT_THROW(load_job(dir_.string()), JobError);
}

TEST_F(TempDir, FileErrorsNameTheFile) {
  const std::string path = write("job.yaml", kMinimal + "optimizer:\n  lr: 0\n");
  try {
    load_job(path);
    FAIL();
  } catch (const JobError& e) {
    EXPECT_EQ(std::string(e.what()), path + ":5:3: optimizer.lr: must be > 0, got 0");
  }
}

TEST_F(TempDir, TorchscriptPathMustExist) {
  const std::string model = write("model.pt", "not really a model");
  const std::string yaml = "steps: 1\nmodel:\n  kind: torchscript\n  trust_code: true\n  path: " + model +
                           "\n  shared: [\"trunk.*\"]\n  task: \"heads.{t}.*\"\ndata: {}\n";
  EXPECT_EQ(load_job_from_string(yaml, "job.yaml").model.path, model);
}

// model.task is one pattern or a list of them; both round-trip in the form they were given.
TEST(ToYaml, TaskPatternsAreOneStringOrAList) {
  LoadOptions one, two;
  one.overrides = {"model.task=heads.{t}.*"};
  two.overrides = {"model.task=[\"adapters.{t}.*\", \"heads.{t}.*\"]"};
  const Job a = load_job_from_string(kMinimal, "a.yaml", one);
  const Job b = load_job_from_string(kMinimal, "b.yaml", two);
  EXPECT_EQ(a.model.task, std::vector<std::string>{"heads.{t}.*"});
  EXPECT_EQ(b.model.task, (std::vector<std::string>{"adapters.{t}.*", "heads.{t}.*"}));
  EXPECT_NE(to_yaml(a).find("task: \"heads.{t}.*\""), std::string::npos) << to_yaml(a);
  EXPECT_NE(to_yaml(b).find("task: [\"adapters.{t}.*\", \"heads.{t}.*\"]"), std::string::npos) << to_yaml(b);
  EXPECT_EQ(load_job_from_string(to_yaml(b), "c.yaml").model.task, b.model.task);
}

TEST(ToYaml, RoundTripsEveryKey) {
  LoadOptions opts;
  opts.overrides = {"job=rt", "seed=99", "optimizer.lr=3.3e-5", "optimizer.betas=[0.5, 0.75]",
                    "log.file=logs/{job}/rank{rank}.log", "metrics.path=\"m: {rank}.jsonl\"",
                    "data.weights=[0.1, 0.2, 0.3, 1e-9]", "data.per_rank=[[0], [1, 2]]",
                    "data.alternate=[shared, \"task:3\", tasks]", "model.task=yes",
                    "model.shared=[\"trunk.*\", \"emb #1\"]", "comm.prune=false",
                    "checkpoint.dir=\"quote\\\"d\"", "export.merged_tasks=[1, 2]"};
  const Job a = load_job_from_string(kMinimal, "a.yaml", opts);
  const std::string text = to_yaml(a);
  const Job b = load_job_from_string(text, "b.yaml");
  EXPECT_EQ(to_yaml(b), text);
  EXPECT_EQ(fingerprint(b), fingerprint(a));
  EXPECT_EQ(b.metrics.path, "m: {rank}.jsonl");
  EXPECT_EQ(b.model.task, std::vector<std::string>{"yes"});
  EXPECT_EQ(b.model.shared[1], "emb #1");
  EXPECT_EQ(b.checkpoint.dir, "quote\"d");
  EXPECT_DOUBLE_EQ(b.optimizer.lr, 3.3e-5);
  EXPECT_EQ(b.data.weights, a.data.weights);
  EXPECT_EQ(b.data.per_rank, a.data.per_rank);
  EXPECT_EQ(b.export_.merged_tasks, (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(contains(text, "optimizer:\n  kind: adamw\n"));
  EXPECT_TRUE(contains(text, "  betas: [0.5, 0.75]\n"));
  EXPECT_TRUE(contains(text, "timeline:\n  path: \"\"\n"));
  // Every key is there: 5 top-level keys + 13 section headers + section keys (model, lora, data,
  // eval, comm, offload, optimizer, train, checkpoint, metrics, log, timeline, export).
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'),
            1 + 5 + 13 + 36 + 4 + 11 + 4 + 9 + 16 + 10 + 4 + 4 + 2 + 3 + 1 + 8);
}

TEST(Fingerprint, ChangesWithSharedSettingsOnly) {
  const Job base = load_job_from_string(kMinimal, "job.yaml");
  const std::string fp = fingerprint(base);
  auto with = [&](const std::string& assignment) {
    LoadOptions opts;
    opts.overrides = {assignment};
    return fingerprint(load_job_from_string(kMinimal, "job.yaml", opts));
  };
  EXPECT_NE(with("steps=11"), fp);
  EXPECT_NE(with("optimizer.lr=0.5"), fp);
  EXPECT_NE(with("model.tasks=5"), fp);
  EXPECT_NE(with("checkpoint.dir=elsewhere"), fp);
  EXPECT_EQ(with("log.level=debug"), fp);
  EXPECT_EQ(with("log.file=x-{rank}.log"), fp);
  EXPECT_EQ(with("metrics.path=m.jsonl"), fp);
  EXPECT_EQ(with("timeline.path=t-{rank}.json"), fp);
  EXPECT_EQ(with("log.progress_every_s=1"), fp);
  EXPECT_TRUE(contains(fp, "steps=10\n"));
  EXPECT_TRUE(contains(fp, "optimizer.betas=[0.9, 0.999]\n"));
  EXPECT_FALSE(contains(fp, "log.level"));
  std::istringstream lines(fp);
  std::vector<std::string> v;
  for (std::string l; std::getline(lines, l);) v.push_back(l);
  EXPECT_TRUE(std::is_sorted(v.begin(), v.end()));
}

TEST(ExpandPath, ReplacesRankAndJob) {
  Job job;
  job.name = "mt-demo";
  EXPECT_EQ(expand_path("runs/{job}/log-{rank}.txt", job, 7), "runs/mt-demo/log-7.txt");
  EXPECT_EQ(expand_path("{rank}{rank}/{other}", job, 1), "11/{other}");
  EXPECT_EQ(expand_path("", job, 0), "");
}

// The example jobs and the benchmarks' jobs.
TEST(Examples, EveryExampleValidates) {
  std::vector<fs::path> files;
  for (const char* dir : {THETAD_EXAMPLES_DIR, THETAD_BENCH_JOBS_DIR})
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  EXPECT_GE(files.size(), 15u);
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    try {
      const Job job = load_job(f.string());
      // What `thetad validate` prints must load again to the same job.
      EXPECT_EQ(fingerprint(load_job_from_string(to_yaml(job), "effective")), fingerprint(job));
    } catch (const JobError& e) {
      ADD_FAILURE() << e.what();
    }
  }
}

}  // namespace
}  // namespace thetad::config
