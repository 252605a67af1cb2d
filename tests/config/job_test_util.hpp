// Shared by the config tests: the smallest valid job, the error text of loading one, and a
// fresh directory per test for files on disk.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "config/loader.hpp"

namespace thetad::config::test {

inline const std::string kMinimal =
    "steps: 10\n"
    "model: {kind: multitask_mlp}\n"
    "data: {}\n";

// load_job_from_string's error text ("job.yaml" names the source), or "(accepted)".
inline std::string error_of(const std::string& yaml, const LoadOptions& opts = {}) {
  try {
    load_job_from_string(yaml, "job.yaml", opts);
  } catch (const JobError& e) {
    return e.what();
  }
  return "(accepted)";
}

inline bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// A directory of the test's own name under the build tree, empty at the start of each test.
class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(THETAD_CONFIG_TEST_TMP) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  std::string write(const std::string& name, const std::string& text) {
    const std::filesystem::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  std::filesystem::path dir_;
};

}  // namespace thetad::config::test
