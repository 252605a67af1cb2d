// Job files that once hung, crashed or exhausted memory stay in the fuzzing corpus
// (tests/fuzz/corpus/job/); every one of them loads here, through the file loader, within a time
// and memory bound, so a regression fails this fast test before any fuzzing. And the expanded
// size of a document is bounded: YAML aliases repeat what they name, so a small file can stand
// for billions of values.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "bounded_run.hpp"
#include "config/loader.hpp"
#include "job_test_util.hpp"

namespace thetad::config {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test::contains;
using test::error_of;
using test::run_bounded;

constexpr size_t kMemoryBound = size_t{2} << 30;  // the fuzzer's -rss_limit_mb

// "job" for a job that loads, "refused" for a JobError; anything else is its exception's text.
std::string load_outcome(const std::string& path) {
  try {
    load_job(path);
    return "job";
  } catch (const JobError&) {
    return "refused";
  }
}

TEST(Corpus, EveryJobInputLoadsWithinBounds) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(THETAD_JOB_CORPUS_DIR))
    if (entry.is_regular_file()) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 20u) << THETAD_JOB_CORPUS_DIR;
  for (const fs::path& f : files) {
    const auto r = run_bounded([&] { return load_outcome(f.string()); }, 10s, kMemoryBound);
    EXPECT_TRUE(r.in_time) << f << ": did not load within 10 s and 2 GiB";
    EXPECT_TRUE(r.text == "job" || r.text == "refused") << f << ": " << r.text;
    // The regressions are bad jobs: each must be refused, not accepted.
    if (f.filename().string().rfind("regress-", 0) == 0) {
      EXPECT_EQ(r.text, "refused") << f;
    }
  }
}

// per_rank: [&r [0, ..., 999], *r, *r, ...]: 605 KB of text, 150 million values once expanded
// (std::bad_alloc after 25 s under a 4 GB limit, before the bound).
TEST(AliasBound, ExpandedValuesAreBounded) {
  std::string ids;
  for (int i = 0; i < 1000; ++i) ids += (i ? ", " : "") + std::to_string(i);
  std::string yaml = "steps: 1\nmodel: {kind: multitask_mlp, tasks: 1000}\ndata:\n  schedule: per_rank\n  per_rank: [&r [" +
                     ids + "]";
  for (int i = 0; i < 150000; ++i) yaml += ", *r";
  yaml += "]\n";
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = run_bounded([&] { return error_of(yaml); }, 20s, size_t{1} << 30);
  ASSERT_TRUE(r.in_time) << "not refused within 20 s and 1 GiB: " << r.text.substr(0, 500);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_TRUE(contains(r.text, "job.yaml:5:")) << r.text.substr(0, 2000);
  // The bound is the size of the text: written out, no value takes less than a byte.
  EXPECT_TRUE(contains(r.text, ": the job expands to more than " + std::to_string(yaml.size()) + " values")) << r.text.substr(0, 2000);
  EXPECT_TRUE(contains(r.text, "job.yaml:5:14: data.per_rank[")) << r.text.substr(0, 2000);
  EXPECT_TRUE(contains(r.text, "YAML aliases")) << r.text.substr(0, 2000);
  // One message for the bound, no flood of the values' own.
  EXPECT_LT(r.text.size(), 20000u);
}

// Bad values behind aliases: the messages are bounded too.
TEST(AliasBound, MessagesAreBounded) {
  std::string yaml = "steps: 1\nmodel: {kind: multitask_mlp}\ndata:\n  weights: &w [";
  for (int i = 0; i < 1000; ++i) yaml += std::string(i ? ", " : "") + "x";
  yaml += "]\n  per_rank: [";
  for (int i = 0; i < 500; ++i) yaml += std::string(i ? ", " : "") + "*w";
  yaml += "]\n";
  const auto r = run_bounded([&] { return error_of(yaml); }, 20s, size_t{1} << 30);
  ASSERT_TRUE(r.in_time);
  EXPECT_TRUE(contains(r.text, "data.weights[0]: expected a number")) << r.text.substr(0, 2000);
  EXPECT_TRUE(contains(r.text, "more errors not shown")) << r.text.substr(0, 2000);
  EXPECT_LT(r.text.size(), 50000u);
}

// Without aliases a text never reaches the bound on values (its size); long lists are checked in
// time proportional to their length (a duplicate check per pair took hours).
TEST(AliasBound, LongListsWithoutAliasesLoad) {
  std::string ids;
  for (int i = 0; i < 150000; ++i) ids += (i ? "," : "") + std::to_string(i);
  const std::string yaml = "steps: 1\nmodel: {kind: multitask_mlp, input_dim: 4, hidden: 4, tasks: 150000}\n"
                           "data: {schedule: per_rank, batch_per_rank: 150001, per_rank: [[" + ids + ",5]]}\n";
  ASSERT_LT(yaml.size(), kMaxJobFileBytes);
  const auto r = run_bounded([&] { return error_of(yaml); }, 20s, size_t{1} << 30);
  ASSERT_TRUE(r.in_time) << "a long per_rank list took over 20 s";
  // The one mistake: the duplicate at its end.
  EXPECT_EQ(r.text, "job.yaml:3:" + std::to_string(yaml.find(",5]]") - yaml.find("data:") + 2) +
                        ": data.per_rank[0][150000]: task 5 is listed twice for rank 0");
}

}  // namespace
}  // namespace thetad::config
