// What a job must say outright before thetad does something that a reader of the job may not
// expect: running a TorchScript file's code (model.trust_code), and exporting adapters whose base
// is not the one trained (export.adapters_dir needs a frozen base).
#include <gtest/gtest.h>

#include <string>

#include "config/loader.hpp"
#include "job_test_util.hpp"

namespace thetad::config {
namespace {

using test::contains;
using test::error_of;
using test::TempDir;

// A TorchScript file is code: its forward may use builtins that read and write files.
TEST_F(TempDir, TorchscriptNeedsTrustCode) {
  const std::string model = write("model.pt", "not really a model");
  const std::string yaml = "steps: 1\nmodel:\n  kind: torchscript\n  path: " + model +
                           "\n  shared: [\"trunk.*\"]\n  task: \"heads.{t}.*\"\ndata: {}\n";
  const std::string what = error_of(yaml);
  EXPECT_TRUE(contains(what, "job.yaml:3:3: model.trust_code: model.kind torchscript runs the code of model.path ('" +
                                 model + "') with your rights"))
      << what;
  EXPECT_TRUE(contains(what, "Set model.trust_code: true")) << what;
  LoadOptions no;
  no.overrides = {"model.trust_code=false"};
  EXPECT_TRUE(contains(error_of(yaml, no), "--set model.trust_code: model.kind torchscript runs the code")) << error_of(yaml, no);

  const std::string trusted = yaml.substr(0, yaml.find("  shared")) + "  trust_code: true\n" +
                              yaml.substr(yaml.find("  shared"));
  const Job job = load_job_from_string(trusted, "job.yaml");
  EXPECT_TRUE(job.model.trust_code);
  ASSERT_EQ(job.notes.size(), 1u);
  EXPECT_TRUE(contains(job.notes[0], "job.yaml:5:3: model.trust_code: the code of model.path ('" + model +
                                         "') runs with your rights"))
      << job.notes[0];
  EXPECT_TRUE(job.warnings.empty());
}

TEST(TrustCode, DefaultsToFalseAndIsIgnoredByBuiltInModels) {
  const Job plain = load_job_from_string(test::kMinimal, "job.yaml");
  EXPECT_FALSE(plain.model.trust_code);
  EXPECT_TRUE(plain.notes.empty());
  const Job job = load_job_from_string("steps: 1\nmodel: {kind: multitask_mlp, trust_code: true}\ndata: {}\n", "job.yaml");
  ASSERT_EQ(job.warnings.size(), 1u);
  EXPECT_TRUE(contains(job.warnings[0], "job.yaml:2:30: model.trust_code: ignored: model.kind is multitask_mlp")) << job.warnings[0];
  EXPECT_TRUE(job.notes.empty());
  EXPECT_TRUE(contains(to_yaml(job), "  trust_code: true\n"));
  EXPECT_NE(fingerprint(job), fingerprint(plain));
}

// PEFT adapters hold the LoRA weights alone: with the base trained too, base + adapter is not the
// trained model.
TEST(ExportDir, NeedsAFrozenBase) {
  const std::string llama = "steps: 1\nmodel: {kind: transformer, arch: llama, tasks: 2}\ndata: {}\n";
  const std::string what = error_of(llama + "export: {adapters_dir: \"ex/{task}\"}\n");
  EXPECT_TRUE(contains(what, "job.yaml:4:")) << what;
  EXPECT_TRUE(contains(what, "export.adapters_dir: PEFT adapters hold the LoRA weights alone, but model.train_shared is "
                             "true (the default)"))
      << what;
  EXPECT_TRUE(contains(what, "Set model.train_shared: false")) << what;
  const std::string explicit_true = error_of(
      "steps: 1\nmodel: {kind: transformer, arch: llama, tasks: 2, train_shared: true}\ndata: {}\n"
      "export: {adapters_dir: \"ex/{task}\"}\n");
  EXPECT_TRUE(contains(explicit_true, "model.train_shared is true;")) << explicit_true;
  EXPECT_EQ(error_of("steps: 1\nmodel: {kind: transformer, arch: llama, tasks: 2, train_shared: false}\ndata: {}\n"
                     "export: {adapters_dir: \"ex/{task}\"}\n"),
            "(accepted)");
}

}  // namespace
}  // namespace thetad::config
