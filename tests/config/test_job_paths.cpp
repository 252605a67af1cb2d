// The path keys of a job: placeholders expanded once, left to right, by one function; a job name
// with braces refused without hanging; control bytes refused in every path key; checkpoint.dir
// one directory for every rank; outputs compared as the files they resolve to; export
// directories that every task would share refused.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "bounded_run.hpp"
#include "config/loader.hpp"
#include "config/placeholders.hpp"
#include "job_test_util.hpp"

namespace thetad::config {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test::contains;
using test::error_of;
using test::kMinimal;
using test::run_bounded;
using test::TempDir;

TEST(Placeholders, ExpandOnceFromLeftToRight) {
  PathValues v;
  v.job = "a{job}{rank}";
  v.rank = 3;
  EXPECT_EQ(expand_placeholders("x/{job}/{rank}.log", v), "x/a{job}{rank}/3.log");
  EXPECT_EQ(expand_placeholders("{job}{job}", v), "a{job}{rank}a{job}{rank}");
  // A placeholder without a value, an unknown one and an unclosed brace stay as written.
  EXPECT_EQ(expand_placeholders("{task}/{other}/{rank", v), "{task}/{other}/{rank");
  v.task = 12;
  EXPECT_EQ(expand_placeholders("ad/{task}/{rank}", v), "ad/12/3");
  EXPECT_EQ(expand_placeholders("", v), "");
  Job job;
  job.name = "j{job}";
  EXPECT_EQ(expand_path("runs/{job}/{rank}", job, 1), "runs/j{job}/1");
}

// A job name holding {job} made every expansion of validation replace without end, growing
// memory; it is refused (the name may not hold braces) at once, wherever {job} appears.
TEST(Placeholders, JobNameWithBracesIsRefusedPromptly) {
  const std::vector<std::string> jobs = {
      kMinimal + "job: a{job}b\nmetrics: {path: \"runs/{job}/m.jsonl\"}\n",
      kMinimal + "job: a{job}b\ncheckpoint: {dir: \"runs/{job}\"}\nlog: {file: \"{job}.log\"}\n",
      "job: a{job}b\nsteps: 1\nmodel: {kind: multitask_mlp, tasks: 2}\ndata: {kind: npy, dir: \"/no/{job}\"}\n",
      "job: a{job}b\nsteps: 1\nmodel: {kind: torchscript, trust_code: true, path: \"/no/{job}.pt\", shared: [\"t.*\"], "
      "task: \"h.{t}.*\"}\ndata: {}\n",
      "job: a{job}b\nsteps: 1\nmodel: {kind: transformer, arch: llama, tasks: 2, train_shared: false}\ndata: {}\n"
      "export: {adapters_dir: \"ex/{job}/{task}\"}\n",
  };
  for (const std::string& yaml : jobs) {
    const auto r = run_bounded([&] { return error_of(yaml); }, 10s, size_t{1} << 30);
    ASSERT_TRUE(r.in_time) << "loading did not end:\n" << yaml;
    EXPECT_TRUE(contains(r.text, "job: must be a non-empty name of letters, digits")) << r.text;
    EXPECT_TRUE(contains(r.text, "got 'a{job}b'")) << r.text;
  }
  LoadOptions opts;
  opts.overrides = {"job=x{job}", "timeline.path={job}-{rank}.json"};
  const auto r = run_bounded([&] { return error_of(kMinimal, opts); }, 10s, size_t{1} << 30);
  ASSERT_TRUE(r.in_time) << "loading with --set job=x{job} did not end";
  EXPECT_TRUE(contains(r.text, "--set job: must be a non-empty name")) << r.text;
}

// Every path key, through the file and through --set: a NUL would cut the path short where the
// run opens it, other control bytes make a name nobody can type.
TEST(PathKeys, ControlBytesAreRefusedInEveryPathKey) {
  const std::vector<std::pair<std::string, std::string>> keys = {
      {"checkpoint", "dir"}, {"metrics", "path"}, {"log", "file"},          {"timeline", "path"},
      {"data", "dir"},       {"model", "path"},   {"model", "init_from"},   {"lora", "init_from"},
      {"export", "adapters_dir"}, {"export", "base_model"}};
  for (const auto& [section, key] : keys) {
    for (const char* escape : {"\\0", "\\x01", "\\t", "\\x7f"}) {
      // The key on line 3, in a section of its own (model and data are required).
      const std::string yaml = "steps: 10\n" + section + ":\n  " + key + ": \"out/a" + escape + "b\"\n" +
                               (section == "model" ? "  kind: multitask_mlp\n" : "model: {kind: multitask_mlp}\n") +
                               (section == "data" ? "" : "data: {}\n");
      const std::string what = error_of(yaml);
      EXPECT_TRUE(contains(what, "job.yaml:3:3: " + section + "." + key + ": holds a control character"))
          << escape << "\n" << what;
    }
    LoadOptions opts;
    opts.overrides = {section + "." + key + "=out/a\x02" + "b"};
    const std::string what = error_of(kMinimal, opts);
    EXPECT_TRUE(contains(what, "--set " + section + "." + key + ": holds a control character (\\x02 at byte 5)"))
        << what;
  }
  // Bytes of UTF-8 names pass.
  EXPECT_EQ(error_of(kMinimal + "metrics: {path: \"out/m\xc3\xa9tr\xc3\xafques.jsonl\"}\n"), "(accepted)");
}

// A checkpoint is one directory: every rank writes its share into it and rank 0 publishes it,
// and every rank reads all of it at resume; a {rank} in it would give each rank another one.
TEST(PathKeys, CheckpointDirIsOneDirectoryForEveryRank) {
  const std::string what = error_of(kMinimal + "checkpoint: {dir: \"ck_{rank}\"}\n");
  EXPECT_TRUE(contains(what, "job.yaml:4:")) << what;
  EXPECT_TRUE(contains(what, "checkpoint.dir: {rank} cannot be used here: a checkpoint is one directory")) << what;
  LoadOptions opts;
  opts.overrides = {"checkpoint.dir=runs/{job}/{rank}"};
  EXPECT_TRUE(contains(error_of(kMinimal, opts), "--set checkpoint.dir: {rank} cannot be used here")) << error_of(kMinimal, opts);
  const Job job = load_job_from_string(kMinimal + "job: j\ncheckpoint: {dir: \"ck/{job}\"}\n", "job.yaml");
  EXPECT_EQ(checkpoint_dir(job), "ck/j");
  EXPECT_EQ(checkpoint_dir(load_job_from_string(kMinimal, "job.yaml")), "");
}

TEST(Outputs, SameFileByAnotherSpellingIsRefused) {
  const std::string what = error_of(kMinimal + "metrics: {path: x.out}\nlog: {file: ./x.out}\n");
  EXPECT_TRUE(contains(what, "job.yaml:5:")) << what;
  EXPECT_TRUE(contains(what, "log.file: is the same path as metrics.path ('x.out'")) << what;
  const std::string dots = error_of(kMinimal + "timeline: {path: out/../out//t.json}\nmetrics: {path: out/t.json}\n");
  EXPECT_TRUE(contains(dots, "timeline.path: is the same path as metrics.path ('out/t.json', here 'out/../out//t.json'"))
      << dots;
  // {rank} is compared as rank 0 writes it: a per-rank log on rank 0 is the metrics file.
  const std::string rank0 = error_of(kMinimal + "metrics: {path: out/r0.txt}\nlog: {file: \"out/r{rank}.txt\"}\n");
  EXPECT_TRUE(contains(rank0, "log.file: is the same path as metrics.path ('out/r0.txt'")) << rank0;
  EXPECT_EQ(error_of(kMinimal + "metrics: {path: out/x.out}\nlog: {file: ./x.out}\n"), "(accepted)");
}

TEST_F(TempDir, OutputThroughASymlinkIntoTheCheckpointDirIsRefused) {
  fs::create_directories(dir_ / "ck");
  fs::create_directory_symlink(dir_ / "ck", dir_ / "link");
  const std::string ck = (dir_ / "ck").string(), link = (dir_ / "link").string();
  const std::string what = error_of(kMinimal + "checkpoint: {dir: \"" + ck + "\"}\nmetrics: {path: \"" + link + "/m.jsonl\"}\n");
  EXPECT_TRUE(contains(what, "job.yaml:5:")) << what;
  EXPECT_TRUE(contains(what, "metrics.path: '" + link + "/m.jsonl' lies inside checkpoint.dir")) << what;
  // The link itself as the checkpoint directory, and a log through it: the same directory.
  const std::string same = error_of(kMinimal + "checkpoint: {dir: \"" + link + "\"}\nlog: {file: \"" + ck + "\"}\n");
  EXPECT_TRUE(contains(same, "log.file: is the same path as checkpoint.dir")) << same;
  EXPECT_EQ(error_of(kMinimal + "checkpoint: {dir: \"" + ck + "\"}\nmetrics: {path: \"" + dir_.string() + "/m.jsonl\"}\n"),
            "(accepted)");
}

TEST_F(TempDir, HardLinkedOutputsAreTheSameFile) {
  const std::string a = write("a.log", "x"), b = (dir_ / "b.log").string();
  fs::create_hard_link(a, b);
  const std::string what = error_of(kMinimal + "metrics: {path: \"" + a + "\"}\nlog: {file: \"" + b + "\"}\n");
  EXPECT_TRUE(contains(what, "log.file: is the same path as metrics.path ('" + a + "'")) << what;
  EXPECT_TRUE(contains(what, "the same file")) << what;
}

const std::string kLlama = "steps: 1\nmodel: {kind: transformer, arch: llama, tasks: 3, train_shared: false}\ndata: {}\n";

// ex/{task}/.. is ex for every task: each task's adapter would overwrite the one before.
TEST(ExportDir, EveryTaskNeedsADirectoryOfItsOwn) {
  for (const std::string dir : {"ex/{task}/..", "ex/{task}/../x", "./{task}/../../ex", "ex/a{task}b/.."}) {
    const std::string what = error_of(kLlama + "export: {adapters_dir: \"" + dir + "\"}\n");
    EXPECT_TRUE(contains(what, "job.yaml:4:")) << what;
    EXPECT_TRUE(contains(what, "export.adapters_dir: '" + dir + "' is the same directory for every task")) << what;
  }
  const std::string init = error_of(kLlama + "lora: {init_from: \"in/{task}/..\"}\n");
  EXPECT_TRUE(contains(init, "lora.init_from: 'in/{task}/..' is the same directory for every task")) << init;
  for (const std::string dir : {"ex/{task}", "ex/{task}/", "ex/{task}/sub/..", "ex/../ex/t{task}", "{task}/out"})
    EXPECT_EQ(error_of(kLlama + "export: {adapters_dir: \"" + dir + "\"}\n"), "(accepted)") << dir;
}

}  // namespace
}  // namespace thetad::config
