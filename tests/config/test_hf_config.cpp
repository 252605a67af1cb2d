// model.init_from's config.json: its Llama keys fill the job's model keys the job does
// not give, and a key the job gives with another value is an error naming both.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <sys/stat.h>
#include <unistd.h>

#include "config/loader.hpp"
#include "job_test_util.hpp"

namespace thetad::config {
namespace {

namespace fs = std::filesystem;

class HfConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("thetad_hf_config_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void config(const std::string& json) { std::ofstream(dir_ / "config.json") << json; }
  std::string job(const std::string& model_extra) const {
    return "steps: 1\nmodel: {kind: transformer, init_from: " + dir_.string() + model_extra + "}\ndata: {}\n";
  }
  fs::path dir_;
};

const char* kLlama = R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 3,
  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 300,
  "rope_theta": 500000.0, "rms_norm_eps": 1e-06, "tie_word_embeddings": true, "hidden_act": "silu",
  "attention_bias": false, "max_position_embeddings": 128, "rope_scaling": null})";

TEST_F(HfConfig, FillsTheModelKeys) {
  config(kLlama);
  const Job j = load_job_from_string(job(""), "job.yaml");
  EXPECT_EQ(j.model.arch, ModelArch::Llama);
  EXPECT_EQ(j.model.d_model, 64);
  EXPECT_EQ(j.model.layers, 3);
  EXPECT_EQ(j.model.heads, 4);
  EXPECT_EQ(j.model.kv_heads, 2);
  EXPECT_EQ(j.model.d_ff, 96);
  EXPECT_EQ(j.model.vocab, 300);
  EXPECT_EQ(j.model.rope_theta, 500000.0);
  EXPECT_EQ(j.model.norm_eps, 1e-6);
  EXPECT_TRUE(j.model.tie_embeddings);
  // Given and equal: accepted.
  EXPECT_EQ(test::error_of(job(", d_model: 64, kv_heads: 2, arch: llama")), "(accepted)");
}

TEST_F(HfConfig, MismatchNamesKeyAndBothValues) {
  config(kLlama);
  const std::string e = test::error_of(job(", d_model: 32"));
  EXPECT_TRUE(test::contains(e, "model.d_model: is 32 but ")) << e;
  EXPECT_TRUE(test::contains(e, "config.json has hidden_size = 64")) << e;
  EXPECT_TRUE(test::contains(test::error_of(job(", arch: gpt2")), "model.arch: is gpt2 but")) << "";
  EXPECT_TRUE(test::contains(test::error_of(job(", seq_len: 256")), "beyond")) << "";
}

TEST_F(HfConfig, RefusesWhatItCannotCompute) {
  config(R"({"model_type": "gpt_neox", "hidden_size": 64})");
  EXPECT_TRUE(test::contains(test::error_of(job("")), "model_type \"gpt_neox\" is not one thetad builds"));
  config(R"({"model_type": "llama", "hidden_act": "gelu"})");
  EXPECT_TRUE(test::contains(test::error_of(job("")), "hidden_act = \"gelu\" is not supported"));
  config(R"({"model_type": "llama", "rope_scaling": {"type": "linear", "factor": 2.0}})");
  EXPECT_TRUE(test::contains(test::error_of(job("")), "rope_scaling"));
  config(R"({"model_type": "llama", "hidden_size": "64"})");
  EXPECT_TRUE(test::contains(test::error_of(job("")), "'hidden_size' is \"64\", not a number"));
  config("{not json");
  EXPECT_TRUE(test::contains(test::error_of(job("")), "config.json: not a JSON object"));
  fs::remove(dir_ / "config.json");
  EXPECT_TRUE(test::contains(test::error_of(job("")), "has no config.json"));
}

// config.json comes with a model from elsewhere: its nesting is bounded at parse (a 200 KB value
// of nested arrays overflowed the stack when an error quoted it), it is read only as a regular
// file of bounded size, never through a link out of its directory, and what it gives must fit.
TEST_F(HfConfig, NestedDeepRefused) {
  config(R"({"model_type": "llama", "hidden_size": )" + std::string(100000, '[') + std::string(100000, ']') + "}");
  const std::string e = test::error_of(job(""));
  EXPECT_TRUE(test::contains(e, (dir_ / "config.json").string() + ": nested deeper than 64 levels")) << e.substr(0, 400);
}

TEST_F(HfConfig, NotARegularFileOrTooLargeRefused) {
  const std::string path = (dir_ / "config.json").string();
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  std::string e = test::error_of(job(""));
  EXPECT_TRUE(test::contains(e, path + ": not a regular file (a FIFO)")) << e;
  fs::remove(path);
  config(std::string(17 << 20, ' ') + kLlama);
  e = test::error_of(job(""));
  EXPECT_TRUE(test::contains(e, path + ": larger than 16777216 bytes")) << e;
}

TEST_F(HfConfig, LinksOnlyWithinTheModel) {
  const std::string path = (dir_ / "config.json").string();
  fs::create_symlink("/etc/passwd", path);
  std::string e = test::error_of(job(""));
  EXPECT_TRUE(test::contains(e, path + ": a symbolic link to /etc/passwd, outside")) << e;
  fs::remove(path);
  std::ofstream(dir_ / "real.json") << kLlama;  // a link within the directory is followed
  fs::create_symlink("real.json", path);
  EXPECT_EQ(test::error_of(job("")), "(accepted)");
  // A Hugging Face cache: REPO/snapshots/REV/config.json -> ../../blobs/HASH.
  const fs::path repo = dir_ / "models--org--tiny", snap = repo / "snapshots" / "abc123";
  fs::create_directories(snap);
  fs::create_directories(repo / "blobs");
  std::ofstream(repo / "blobs" / "f00d") << kLlama;
  fs::create_symlink("../../blobs/f00d", snap / "config.json");
  const std::string yaml = "steps: 1\nmodel: {kind: transformer, init_from: " + snap.string() + "}\ndata: {}\n";
  EXPECT_EQ(test::error_of(yaml), "(accepted)");
}

TEST_F(HfConfig, IntegersMustFit) {
  config(R"({"model_type": "llama", "hidden_size": 18446744073709551615, "num_hidden_layers": -2})");
  const std::string e = test::error_of(job(""));
  const std::string file = (dir_ / "config.json").string();
  EXPECT_TRUE(test::contains(e, file + ": 'hidden_size' is 18446744073709551615, not an integer in 1..")) << e;
  EXPECT_TRUE(test::contains(e, file + ": 'num_hidden_layers' is -2, not an integer in 1..")) << e;
  EXPECT_FALSE(test::contains(e, "model.d_model:")) << e;  // not blamed on the job's own key
}

// A config.json, or a model directory, that cannot be read is reported with the system's reason,
// not as missing or malformed. Root reads anything: the check runs as nobody in a child process.
TEST_F(HfConfig, UnreadableReportedAsSuch) {
  config(kLlama);
  const std::string file = (dir_ / "config.json").string();
  for (const bool whole_dir : {false, true}) {
    ::chmod(whole_dir ? dir_.c_str() : file.c_str(), whole_dir ? 0700 : 0);
    EXPECT_EXIT(
        {
          if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) std::exit(3);
          const std::string e = test::error_of(job(""));
          std::fprintf(stderr, "%s\n", e.c_str());
          std::exit(test::contains(e, file + ": cannot read: Permission denied") ? 0 : 1);
        },
        ::testing::ExitedWithCode(0), "Permission denied");
    ::chmod(dir_.c_str(), 0755);
    ::chmod(file.c_str(), 0644);
  }
}

}  // namespace
}  // namespace thetad::config
