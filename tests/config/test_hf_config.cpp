// model.init_from's config.json: the keys of a Llama, Mistral, Qwen2 or Qwen3 model fill the job's
// model keys the job does not give, a key the job gives with another value is an error naming
// both, and what thetad cannot compute is refused naming the file and the key; and the export
// keys that write Hugging Face directories.
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
  EXPECT_TRUE(test::contains(test::error_of(job("")), "model_type \"gpt_neox\" is not one thetad builds (llama, mistral, "
                                                      "qwen2, qwen3)"));
  config(R"({"model_type": "llama", "hidden_act": "gelu"})");
  EXPECT_TRUE(test::contains(test::error_of(job("")), "hidden_act = \"gelu\" is not supported"));
  config(R"({"model_type": "llama", "rope_scaling": {"type": "linear", "factor": 2.0}})");
  EXPECT_TRUE(test::contains(test::error_of(job("")), "rope_scaling of type \"linear\" is not supported"));
  config(R"({"model_type": "llama", "hidden_size": "64"})");
  EXPECT_TRUE(test::contains(test::error_of(job("")), "'hidden_size' is \"64\", not a number"));
  config("{not json");
  EXPECT_TRUE(test::contains(test::error_of(job("")), "config.json: not a JSON object"));
  fs::remove(dir_ / "config.json");
  EXPECT_TRUE(test::contains(test::error_of(job("")), "has no config.json"));
}

// Llama 3.1 / 3.2: rope_scaling llama3 (rope_type, or the older key type) fills model.rope_*.
TEST_F(HfConfig, Llama3RopeScaling) {
  const std::string scaling = R"("factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192)";
  for (const char* type : {"rope_type", "type"}) {
    config(R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
      "rope_theta": 500000.0, "tie_word_embeddings": true, "rope_scaling": {)" + scaling + ", \"" + type +
           R"(": "llama3"}})");
    const Job j = load_job_from_string(job(""), "job.yaml");
    EXPECT_EQ(j.model.rope_scaling, RopeScaling::Llama3) << type;
    EXPECT_EQ(j.model.rope_factor, 32.0);
    EXPECT_EQ(j.model.rope_low_freq_factor, 1.0);
    EXPECT_EQ(j.model.rope_high_freq_factor, 4.0);
    EXPECT_EQ(j.model.rope_original_max_positions, 8192);
    EXPECT_EQ(j.model.rope_theta, 500000.0);
    EXPECT_EQ(j.model.head_dim, 0) << "16 = hidden_size / heads: no head_dim of its own";
    EXPECT_TRUE(j.model.tie_embeddings);
  }
  // A job that says otherwise is told both values.
  const std::string e = test::error_of(job(", rope_scaling: none"));
  EXPECT_TRUE(test::contains(e, "model.rope_scaling: is none but ")) << e;
  EXPECT_TRUE(test::contains(e, "has rope_scaling.rope_type = llama3")) << e;
  EXPECT_TRUE(test::contains(test::error_of(job(", rope_factor: 8")), "has rope_scaling.factor = 32"));
  // Every one of llama3's numbers is needed.
  config(R"({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192}})");
  EXPECT_TRUE(test::contains(test::error_of(job("")), "config.json: rope_scaling.high_freq_factor is missing"));
  // Other rope types are refused naming the type; "default" is the plain one.
  config(R"({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})");
  EXPECT_TRUE(test::contains(test::error_of(job("")), "rope_scaling of type \"yarn\" is not supported (thetad computes "
                                                      "the default rotary positions and llama3's)"));
  config(R"({"model_type": "llama", "rope_scaling": {"rope_type": "default"}})");
  EXPECT_EQ(test::error_of(job("")), "(accepted)");
}

// transformers 5 writes the rotary settings into rope_parameters, rope_theta included.
TEST_F(HfConfig, RopeParameters) {
  config(R"({"model_type": "llama", "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3",
    "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})");
  const Job j = load_job_from_string(job(""), "job.yaml");
  EXPECT_EQ(j.model.rope_theta, 500000.0);
  EXPECT_EQ(j.model.rope_scaling, RopeScaling::Llama3);
  EXPECT_EQ(j.model.rope_factor, 8.0);
  config(R"({"model_type": "qwen3", "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}})");
  EXPECT_EQ(load_job_from_string(job(""), "job.yaml").model.rope_theta, 1000000.0);
  // The scaling under its old name, rope_theta under the new one.
  config(R"({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, "rope_parameters": {"rope_theta": 500000.0}})");
  EXPECT_EQ(load_job_from_string(job(""), "job.yaml").model.rope_theta, 500000.0);
  EXPECT_TRUE(test::contains(test::error_of(job(", rope_theta: 10000")), "has rope_parameters.rope_theta = 500000"));
  config(R"({"model_type": "llama", "rope_parameters": {"rope_theta": 10000.0, "rope_type": "dynamic", "factor": 2.0}})");
  EXPECT_TRUE(test::contains(test::error_of(job("")), "rope_parameters of type \"dynamic\" is not supported"));
  config(R"({"model_type": "llama", "partial_rotary_factor": 0.5})");
  EXPECT_TRUE(test::contains(test::error_of(job("")), "partial_rotary_factor = 0.5 is not supported"));
}

TEST_F(HfConfig, Families) {
  // Mistral-Nemo's shape: heads of head_dim 128, together wider than hidden_size.
  config(R"({"model_type": "mistral", "hidden_size": 5120, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "sliding_window": null, "rope_theta": 1000000.0})");
  Job j = load_job_from_string(job(", seq_len: 4"), "job.yaml");
  EXPECT_EQ(j.model.arch, ModelArch::Mistral);
  EXPECT_EQ(j.model.head_dim, 128);
  EXPECT_EQ(j.model.head_size(), 128);
  // Qwen2: biases whatever attention_bias says; the window off.
  config(R"({"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4, "use_sliding_window": false,
    "sliding_window": 8, "max_window_layers": 0, "tie_word_embeddings": true})");
  j = load_job_from_string(job(""), "job.yaml");
  EXPECT_EQ(j.model.arch, ModelArch::Qwen2);
  EXPECT_EQ(j.model.head_dim, 0);
  // Qwen3: head_dim 128 where config.json leaves it out (Qwen3Config's default).
  config(R"({"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4})");
  j = load_job_from_string(job(""), "job.yaml");
  EXPECT_EQ(j.model.arch, ModelArch::Qwen3);
  EXPECT_EQ(j.model.head_dim, 128);
  EXPECT_TRUE(test::contains(test::error_of(job(", head_dim: 64")), "model.head_dim: is 64 but the heads of "
                                                                    "model.init_from's config are 128 wide"));
  EXPECT_TRUE(test::contains(test::error_of(job(", arch: llama")), "model.arch: is llama but ")) << "";
  EXPECT_TRUE(test::contains(test::error_of(job(", arch: llama")), "describes a qwen3 model (model_type)")) << "";
  EXPECT_EQ(test::error_of(job(", arch: qwen3, head_dim: 128")), "(accepted)");
  config(R"({"model_type": "qwen3", "attention_bias": true})");
  EXPECT_TRUE(test::contains(test::error_of(job("")), "attention_bias = true is not supported"));
  config(R"({"model_type": "llama", "mlp_bias": true})");
  EXPECT_TRUE(test::contains(test::error_of(job("")), "mlp_bias = true is not supported"));
}

// A sliding window in use that a row would outgrow: thetad's attention is not the window's there.
TEST_F(HfConfig, SlidingWindow) {
  const std::string seq = ", seq_len: 16";
  config(R"({"model_type": "mistral", "sliding_window": 8})");
  std::string e = test::error_of(job(seq));
  EXPECT_TRUE(test::contains(e, "model.seq_len: is 16, beyond ")) << e;
  EXPECT_TRUE(test::contains(e, "config.json's sliding_window = 8")) << e;
  config(R"({"model_type": "mistral"})");  // MistralConfig's default window: 4096
  EXPECT_TRUE(test::contains(test::error_of(job(", seq_len: 5000")), "sliding_window = 4096"));
  EXPECT_EQ(test::error_of(job(", seq_len: 4096")), "(accepted)");
  config(R"({"model_type": "mistral", "sliding_window": 16})");
  EXPECT_EQ(test::error_of(job(seq)), "(accepted)");
  config(R"({"model_type": "qwen2", "num_hidden_layers": 4, "use_sliding_window": true, "sliding_window": 8,
    "max_window_layers": 2})");
  EXPECT_TRUE(test::contains(test::error_of(job(seq)), "sliding_window = 8"));
  config(R"({"model_type": "qwen2", "num_hidden_layers": 4, "use_sliding_window": true, "sliding_window": 8,
    "max_window_layers": 4})");  // no layer from max_window_layers on
  EXPECT_EQ(test::error_of(job(seq)), "(accepted)");
  config(R"({"model_type": "qwen3", "sliding_window": 8, "layer_types": ["full_attention", "sliding_attention"]})");
  EXPECT_TRUE(test::contains(test::error_of(job(seq)), "sliding_window = 8"));
}

TEST_F(HfConfig, HeadAndRopeKeysAreChecked) {
  const auto scratch = [](const std::string& extra) {
    return "steps: 1\nmodel: {kind: transformer, arch: llama, d_model: 64" + extra + "}\ndata: {}\n";
  };
  EXPECT_EQ(test::error_of(scratch(", head_dim: 24, heads: 3")), "(accepted)");  // 64 % 3: its own head size
  EXPECT_TRUE(test::contains(test::error_of(scratch(", heads: 3")), "model.heads: must divide model.d_model (64)"));
  EXPECT_TRUE(test::contains(test::error_of(scratch(", head_dim: 9")),
                             "model.head_dim: the rotary positions need an even head size; model.head_dim is 9"));
  EXPECT_TRUE(test::contains(test::error_of(scratch(", head_dim: -1")), "model.head_dim: must be >= 0"));
  EXPECT_TRUE(test::contains(test::error_of(scratch(", rope_scaling: yarn")), "model.rope_scaling: must be one of none, llama3"));
  EXPECT_TRUE(test::contains(test::error_of(scratch(", rope_scaling: llama3, rope_high_freq_factor: 1")),
                             "model.rope_high_freq_factor: must be above model.rope_low_freq_factor (1), got 1"));
  EXPECT_TRUE(test::contains(test::error_of(scratch(", rope_scaling: llama3, rope_original_max_positions: 0")),
                             "model.rope_original_max_positions: must be >= 1"));
  EXPECT_TRUE(test::contains(test::error_of(scratch(", rope_scaling: llama3, rope_factor: 0")),
                             "model.rope_factor: must be a finite number > 0, got 0"));
  EXPECT_EQ(test::error_of(scratch(", rope_scaling: llama3, rope_factor: 32")), "(accepted)");
}

// export.dtype, export.merged_dir and export.merged_tasks: refused before anything starts.
TEST_F(HfConfig, ExportKeysAreChecked) {
  config(kLlama);
  const auto exp = [&](const std::string& extra) {
    return "steps: 1\nmodel: {kind: transformer, tasks: 3, train_shared: false, init_from: " + dir_.string() +
           "}\ndata: {}\nexport: {" + extra + "}\n";
  };
  EXPECT_EQ(test::error_of(exp("merged_dir: 'm/{task}', merged_tasks: [0, 2], dtype: bf16")), "(accepted)");
  EXPECT_TRUE(test::contains(test::error_of(exp("dtype: fp8")), "export.dtype: must be one of fp32, bf16, fp16"));
  EXPECT_TRUE(test::contains(test::error_of(exp("merged_dir: 'm/{task}'")),
                             "export.merged_tasks: is empty but model.tasks is 3: list the tasks to merge"));
  EXPECT_TRUE(test::contains(test::error_of(exp("merged_dir: 'm/{task}', merged_tasks: [3]")),
                             "export.merged_tasks[0]: must be a task of 0 .. model.tasks - 1 (2), got 3"));
  EXPECT_TRUE(test::contains(test::error_of(exp("merged_dir: 'm/{task}', merged_tasks: [1, 1]")),
                             "export.merged_tasks[1]: task 1 is listed twice"));
  EXPECT_TRUE(test::contains(test::error_of(exp("merged_dir: m, merged_tasks: [0, 1]")),
                             "export.merged_dir: has no {task} but export.merged_tasks lists 2 tasks"));
  EXPECT_TRUE(test::contains(test::error_of(exp("merged_dir: 'm/{task}/..', merged_tasks: [0, 1]")),
                             "is the same directory for every task"));
  EXPECT_TRUE(test::contains(test::error_of(exp("merged_tasks: [0]")),
                             "export.merged_tasks: lists tasks but there is no export.merged_dir"));
  EXPECT_TRUE(test::contains(test::error_of(exp("merged_dir: m, merged_tasks: [0], max_shard_mb: 0")),
                             "export.max_shard_mb: must be > 0"));
  EXPECT_TRUE(test::contains(test::error_of(exp("merged_dir: 'm/{task}', adapters_dir: 'm/{task}', merged_tasks: [0]")),
                             "export.merged_dir: is export.adapters_dir"));
  // A merged model holds the base as trained: no refusal of a trained base, unlike the adapters.
  EXPECT_EQ(test::error_of("steps: 1\nmodel: {kind: transformer, tasks: 1, init_from: " + dir_.string() +
                           "}\ndata: {}\nexport: {merged_dir: m}\n"),
            "(accepted)");
  // The merged model's config.json is the base's: a base without one cannot be merged.
  fs::remove(dir_ / "config.json");
  std::ofstream(dir_ / "w.safetensors") << "x";
  const std::string file = "steps: 1\nmodel: {kind: transformer, init_from: " + (dir_ / "w.safetensors").string() +
                           "}\ndata: {}\nexport: {merged_dir: m}\n";
  EXPECT_TRUE(test::contains(test::error_of(file), "export.merged_dir: a merged model's config.json is model.init_from's, but"));
  EXPECT_TRUE(test::contains(test::error_of("steps: 1\nmodel: {kind: transformer, arch: gpt2}\ndata: {}\nexport: {merged_dir: m}\n"),
                             "export.merged_dir: merged models are written in the Hugging Face layouts"));
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
