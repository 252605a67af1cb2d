// safetensors from others: a header nested deep (its shape), names with control bytes quoted
// escaped, a model directory whose index names a link out of it (refused) or into the blobs of
// its Hugging Face cache (read), a directory that cannot be read (the system's reason), non-finite
// values found on the raw bits of each float dtype, and adapter_config.json checked torch-free.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "common/errors.hpp"
#include "config/loader.hpp"
#include "daemon/plan/peft_config.hpp"
#include "daemon/formats/safetensors.hpp"
#include "tests/daemon/test_util.hpp"

namespace thetad::daemon {
namespace {

namespace fs = std::filesystem;
using test::expect_config_error;
using test::put;
using test::st_bytes;

// A value nested 100,000 levels deep was quoted whole in the error (dump() recursed per level).
TEST(SafetensorsTrust, DeepShapeRefused) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string b = st_bytes(R"({"w":{"dtype":"F32","shape":[)" + deep + R"(],"data_offsets":[0,0]}})", "");
  expect_config_error([&] { parse_safetensors_header(b.data(), b.size(), "deep.safetensors"); }, "deep.safetensors",
                      "safetensors header is nested deeper than 64 levels");
  const std::string b2 = st_bytes(R"({"w":{"dtype":"F32","shape":[[1]],"data_offsets":[0,0]}})", "");
  expect_config_error([&] { parse_safetensors_header(b2.data(), b2.size(), "x.safetensors"); }, "x.safetensors",
                      "a dimension must be a non-negative integer, found an array of 1 item");
}

TEST(SafetensorsTrust, NamesQuotedEscaped) {
  const std::string b = st_bytes("{\"w\\u001b[2J\\u009b31m\":{\"dtype\":\"Q8\\u0007\",\"shape\":[],\"data_offsets\":[0,0]}}", "");
  try {
    parse_safetensors_header(b.data(), b.size(), "esc.safetensors");
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\x1b'), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\x07'), std::string::npos) << msg;
    EXPECT_EQ(msg.find("\xc2\x9b"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tensor 'w\\x1b[2J\\xc2\\x9b31m': unknown dtype 'Q8\\x07'"), std::string::npos) << msg;
  }
}

// A model directory: index and shards, a shard being `link` (a symbolic link) to `target`.
void sharded(const fs::path& dir, const fs::path& second) {
  fs::create_directories(dir);
  const std::vector<float> a = {1, 2}, b = {3};
  write_safetensors((dir / "a.safetensors").string(), {{"x", "F32", {2}, a.data(), 8}});
  write_safetensors(second.string(), {{"y", "F32", {1}, b.data(), 4}});
  put((dir / "model.safetensors.index.json").string(),
      R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})");
}

TEST(SafetensorsTrust, IndexLinksStayInTheModel) {
  test::ScratchDir scratch;
  const fs::path dir = scratch.file("model");
  fs::create_directories(dir);
  // b.safetensors -> a file outside the directory (as /etc/shadow would be): refused, unread.
  sharded(dir, scratch.file("elsewhere.safetensors"));
  fs::create_symlink(scratch.file("elsewhere.safetensors"), dir / "b.safetensors");
  expect_config_error([&] { SafetensorsCheckpoint::open(dir.string()); }, (dir / "b.safetensors").string(),
                      "a symbolic link to " + scratch.file("elsewhere.safetensors") + ", outside");
  fs::remove(dir / "b.safetensors");
  fs::create_symlink("/etc/passwd", dir / "b.safetensors");
  expect_config_error([&] { SafetensorsCheckpoint::open(dir.string()); }, (dir / "b.safetensors").string(),
                      "a symbolic link to /etc/passwd, outside");
  // A shard's name with a control byte is no file name (paths built from it are quoted).
  put((dir / "model.safetensors.index.json").string(), R"({"weight_map": {"x": "a\u001b[2J.safetensors"}})");
  expect_config_error([&] { SafetensorsCheckpoint::open(dir.string()); }, "model.safetensors.index.json",
                      "weight_map: tensor 'x': 'a\\x1b[2J.safetensors' is not a file name in the directory");
  // A Hugging Face cache: snapshots/REV/* -> ../../blobs/*: read.
  const fs::path repo = scratch.file("models--org--m"), snap = repo / "snapshots" / "r1";
  fs::create_directories(repo / "blobs");
  sharded(repo / "blobs", repo / "blobs" / "b.safetensors");
  fs::create_directories(snap);
  for (const char* f : {"a.safetensors", "b.safetensors", "model.safetensors.index.json"})
    fs::create_symlink(std::string("../../blobs/") + f, snap / f);
  const SafetensorsCheckpoint ck = SafetensorsCheckpoint::open(snap.string());
  float y = 0;
  ck.read_fp32("y", {1}, &y);
  EXPECT_EQ(y, 3.0f);
}

// Root reads anything: the reads run as nobody in a child process.
TEST(SafetensorsTrust, UnreadableDirectoryReportedAsSuch) {
  test::ScratchDir scratch;
  const fs::path dir = scratch.file("model");
  sharded(dir, dir / "b.safetensors");
  ::chmod(dir.c_str(), 0700);
  EXPECT_EXIT(
      {
        if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) std::exit(3);
        try {
          SafetensorsCheckpoint::open(dir.string());
        } catch (const ConfigError& e) {
          std::fprintf(stderr, "%s\n", e.what());
          std::exit(std::string(e.what()).find("model.safetensors.index.json: cannot read: Permission denied") !=
                            std::string::npos
                        ? 0
                        : 1);
        }
        std::exit(2);
      },
      ::testing::ExitedWithCode(0), "Permission denied");
  ::chmod(dir.c_str(), 0755);
}

TEST(SafetensorsTrust, FirstNonFiniteOnTheBits) {
  std::vector<float> f(3000, 1.5f);
  EXPECT_EQ(st_first_nonfinite("F32", f.data(), f.size()), -1);
  f[2500] = -std::numeric_limits<float>::infinity();
  f[2900] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(st_first_nonfinite("F32", f.data(), f.size()), 2500);
  EXPECT_EQ(st_nonfinite_text("F32", f.data(), 2500), "value 2500 is -inf");
  EXPECT_EQ(st_nonfinite_text("F32", f.data(), 2900), "value 2900 is nan");
  EXPECT_EQ(st_first_nonfinite("F32", reinterpret_cast<const char*>(f.data()) + 4, 2000), -1);  // unaligned
  std::vector<uint16_t> bf(10, st_fp32_to_bf16(2.0f)), h(10, 0x3c00);
  bf[7] = 0x7f80;  // +inf
  h[3] = 0x7e00;   // NaN
  h[4] = 0x7bff;   // 65504, finite
  EXPECT_EQ(st_first_nonfinite("BF16", bf.data(), bf.size()), 7);
  EXPECT_EQ(st_nonfinite_text("BF16", bf.data(), 7), "value 7 is inf");
  EXPECT_EQ(st_first_nonfinite("F16", h.data(), h.size()), 3);
  EXPECT_EQ(st_first_nonfinite("I32", h.data(), 5), -1);
}

class AdapterConfig : public ::testing::Test {
 protected:
  config::Job job_ = [] {
    config::LoadOptions lo;
    return config::load_job_from_string(
        "steps: 1\nmodel: {kind: transformer, arch: llama, layers: 1, d_model: 8, heads: 2, vocab: 16, seq_len: 4}\n"
        "lora: {rank: 2, alpha: 4, targets: [q, v]}\ndata: {}\n",
        "job.yaml", lo);
  }();
  test::ScratchDir dir_;
  void config(const std::string& text) const { put(dir_.file("adapter_config.json"), text); }
  std::string error() const {
    try {
      check_adapter_config(dir_.file(""), job_);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(accepted)";
  }
};

TEST_F(AdapterConfig, ChecksAgainstTheJob) {
  config(R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["v_proj", "q_proj"], "bias": "none"})");
  EXPECT_EQ(error(), "(accepted)");
  config(R"({"peft_type": "LORA", "r": 4, "lora_alpha": 4, "target_modules": ["q_proj", "v_proj"]})");
  EXPECT_NE(error().find("adapter_config.json: lora.init_from: r = 4 but lora.rank is 2"), std::string::npos) << error();
  config(R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "\u001b[2J"]})");
  EXPECT_NE(error().find("target_modules = [\\x1b[2J, q_proj] but lora.targets gives [q_proj, v_proj]"), std::string::npos)
      << error();
  config(R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": "all-linear"})");
  EXPECT_NE(error().find("target_modules = \"all-linear\" but"), std::string::npos) << error();
  config(R"({"peft_type": )" + std::string(1000, '[') + std::string(1000, ']') + "}");
  EXPECT_NE(error().find("lora.init_from: nested deeper than 64 levels"), std::string::npos) << error();
  config(std::string(17 << 20, ' '));
  EXPECT_NE(error().find("lora.init_from: larger than 16777216 bytes"), std::string::npos) << error();
  fs::remove(dir_.file("adapter_config.json"));
  EXPECT_NE(error().find("adapter_config.json: lora.init_from: cannot read (a PEFT adapter directory has one): No such file"),
            std::string::npos)
      << error();
}

}  // namespace
}  // namespace thetad::daemon
