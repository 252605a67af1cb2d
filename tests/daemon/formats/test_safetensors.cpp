// safetensors: files written by write_safetensors and byte by byte, read back through the
// checkpoint (one file, a directory, shards with an index), dtype conversion, and every kind of
// bad input, each a ConfigError naming the file and the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/errors.hpp"
#include "daemon/formats/hf_names.hpp"
#include "daemon/formats/safetensors.hpp"
#include "tests/daemon/test_util.hpp"

namespace thetad::daemon {
namespace {

using test::expect_config_error;
using test::put;
using test::st_bytes;

TEST(Safetensors, WriteReadRoundTripAllFloatDtypes) {
  test::ScratchDir dir;
  const std::string path = dir.file("m.safetensors");
  const std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, 65504.0f};
  std::vector<uint16_t> bf16;
  for (float f : f32) bf16.push_back(st_fp32_to_bf16(f));
  // F16 bits of 1, -2, 0.5, a subnormal (2^-24), +inf, 65504.
  const std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x3800, 0x0001, 0x7c00, 0x7bff};
  write_safetensors(path,
                    {{"a.f32", "F32", {2, 3}, f32.data(), f32.size() * 4},
                     {"b.bf16", "BF16", {6}, bf16.data(), bf16.size() * 2},
                     {"c.f16", "F16", {3, 2}, f16.data(), f16.size() * 2}},
                    {{"format", "pt"}});
  const std::string bytes = test::read_file(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  const auto ck = SafetensorsCheckpoint::open(path);
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a.f32", "b.bf16", "c.f16"}));
  std::vector<float> out(6);
  ck.read_fp32("a.f32", {2, 3}, out.data());
  EXPECT_EQ(out, f32);
  ck.read_fp32("b.bf16", {6}, out.data());
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(out[i], f32[i], std::fabs(f32[i]) / 128) << i;
  EXPECT_EQ(out[0], 1.5f);
  ck.read_fp32("c.f16", {3, 2}, out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 0.5f);
  EXPECT_EQ(out[3], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(out[4]));
  EXPECT_EQ(out[5], 65504.0f);
  EXPECT_EQ(SafetensorsFile::open(path).header().metadata.at("format"), "pt");
  expect_config_error([&] { ck.read_fp32("a.f32", {3, 2}, out.data()); }, path, "tensor 'a.f32' has shape [2, 3], expected [3, 2]");
  expect_config_error([&] { ck.tensor("nope"); }, path, "tensor 'nope' is missing");
}

TEST(Safetensors, Bf16RoundsToNearestEven) {
  EXPECT_EQ(st_fp32_to_bf16(1.0f), 0x3f80);
  float f;
  uint32_t bits = 0x3f808000u;  // exactly half way: to even (0x3f80)
  std::memcpy(&f, &bits, 4);
  EXPECT_EQ(st_fp32_to_bf16(f), 0x3f80);
  bits = 0x3f818000u;  // half way above an odd: up
  std::memcpy(&f, &bits, 4);
  EXPECT_EQ(st_fp32_to_bf16(f), 0x3f82);
}

TEST(Safetensors, ShardedDirectoryWithIndex) {
  test::ScratchDir dir;
  const std::string d = dir.file("ckpt");
  std::filesystem::create_directories(d);
  const std::vector<float> a = {1, 2}, b = {3, 4, 5};
  write_safetensors(d + "/model-00001-of-00002.safetensors", {{"x", "F32", {2}, a.data(), 8}});
  write_safetensors(d + "/model-00002-of-00002.safetensors", {{"y", "F32", {3}, b.data(), 12}});
  put(d + "/model.safetensors.index.json",
      R"({"metadata": {"total_size": 20}, "weight_map": {"x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}})");
  const auto ck = SafetensorsCheckpoint::open(d);
  std::vector<float> out(3);
  ck.read_fp32("y", {3}, out.data());
  EXPECT_EQ(out, b);
  EXPECT_EQ(ck.file_of("x"), d + "/model-00001-of-00002.safetensors");

  // The index names a tensor its file does not hold.
  put(d + "/model.safetensors.index.json",
      R"({"weight_map": {"x": "model-00002-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}})");
  expect_config_error([&] { SafetensorsCheckpoint::open(d); }, "model-00002-of-00002.safetensors", "tensor 'x'");
  // A tensor in two shards.
  write_safetensors(d + "/model-00002-of-00002.safetensors", {{"x", "F32", {2}, a.data(), 8}});
  put(d + "/model.safetensors.index.json",
      R"({"weight_map": {"x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}})");
  expect_config_error([&] { SafetensorsCheckpoint::open(d); }, "model-00002-of-00002.safetensors", "tensor 'x' is also in");
  // A shard path that leaves the directory.
  put(d + "/model.safetensors.index.json", R"({"weight_map": {"x": "../evil.safetensors"}})");
  expect_config_error([&] { SafetensorsCheckpoint::open(d); }, "model.safetensors.index.json", "not a file name");
  put(d + "/model.safetensors.index.json", R"({"weight_map": [1, 2]})");
  expect_config_error([&] { SafetensorsCheckpoint::open(d); }, "model.safetensors.index.json", "weight_map");
  // A directory with neither.
  const std::string empty = dir.file("empty");
  std::filesystem::create_directories(empty);
  expect_config_error([&] { SafetensorsCheckpoint::open(empty); }, empty, "neither model.safetensors");
}

TEST(Safetensors, BadHeaders) {
  test::ScratchDir dir;
  const std::string p = dir.file("bad.safetensors");
  const auto check = [&](const std::string& bytes, const std::string& what) {
    put(p, bytes);
    expect_config_error([&] { SafetensorsFile::open(p); }, p, what);
  };
  const std::string ok = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  put(p, st_bytes(ok, std::string(8, '\0')));
  EXPECT_EQ(SafetensorsFile::open(p).header().tensors.size(), 1u);

  check("\x10\0\0", "fewer than the 8");
  check(st_bytes(ok, std::string(8, '\0')).substr(0, 20), "truncated safetensors file");
  check(std::string("\xff\xff\xff\xff\xff\0\0\0", 8) + "{}", "above the format's limit");
  check(st_bytes("{\"w\": [", ""), "not valid JSON");
  check(st_bytes("[1, 2]", ""), "not a JSON object");
  check(st_bytes(ok, std::string(4, '\0')), "tensor 'w': data_offsets [0, 8) out of range");
  check(st_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')),
        "tensor 'w': shape [3] of F32 needs 12 bytes");
  check(st_bytes(R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0')),
        "tensor 'w': unknown dtype 'Q4'");
  check(st_bytes(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0')),
        "tensor 'w': a dimension must be a non-negative integer");
  check(st_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::string(8, '\0')),
        "tensor 'w': data_offsets [8, 0) out of range");
  check(st_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", std::string(8, '\0')),
        "tensor 'w': unknown field 'extra'");
  check(st_bytes(R"({"w":{"dtype":"F32","shape":[2]}})", std::string(8, '\0')), "tensor 'w': data_offsets must be");
  check(st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 std::string(12, '\0')),
        "tensors 'a' and 'b' overlap");
  check(st_bytes(R"({"__metadata__":{"k":1}})", ""), "__metadata__ 'k' is not a string");
  check(st_bytes(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", std::string(8, '\0')),
        "overflows int64");
  put(p, "");
  expect_config_error([&] { SafetensorsFile::open(p); }, p, "empty file");
  expect_config_error([&] { SafetensorsFile::open(dir.file("none.safetensors")); }, "none.safetensors", "cannot open");

  // A known dtype that is not floating point: refused at conversion, naming the tensor.
  const std::vector<int32_t> ints = {1, 2};
  write_safetensors(p, {{"ids", "I32", {2}, ints.data(), 8}});
  std::vector<float> out(2);
  expect_config_error([&] { SafetensorsCheckpoint::open(p).read_fp32("ids", {2}, out.data()); }, p,
               "tensor 'ids': dtype I32 is not a floating-point type");
}

TEST(HfNames, LlamaBothWays) {
  const std::pair<const char*, const char*> pairs[] = {
      {"model.embed_tokens.weight", "embed.weight"},
      {"model.layers.0.input_layernorm.weight", "blocks.0.ln1.weight"},
      {"model.layers.12.self_attn.q_proj.weight", "blocks.12.attn.q.weight"},
      {"model.layers.3.self_attn.k_proj.weight", "blocks.3.attn.k.weight"},
      {"model.layers.3.self_attn.v_proj.weight", "blocks.3.attn.v.weight"},
      {"model.layers.3.self_attn.o_proj.weight", "blocks.3.attn.o.weight"},
      {"model.layers.7.post_attention_layernorm.weight", "blocks.7.ln2.weight"},
      {"model.layers.7.mlp.gate_proj.weight", "blocks.7.mlp.gate.weight"},
      {"model.layers.7.mlp.up_proj.weight", "blocks.7.mlp.up.weight"},
      {"model.layers.7.mlp.down_proj.weight", "blocks.7.mlp.down.weight"},
      {"model.norm.weight", "ln_f.weight"},
      {"lm_head.weight", "lm_head.weight"},
      // Qwen2's biases of q, k and v; Qwen3's norms of each query and key head.
      {"model.layers.2.self_attn.q_proj.bias", "blocks.2.attn.q.bias"},
      {"model.layers.2.self_attn.k_proj.bias", "blocks.2.attn.k.bias"},
      {"model.layers.2.self_attn.v_proj.bias", "blocks.2.attn.v.bias"},
      {"model.layers.4.self_attn.q_norm.weight", "blocks.4.attn.q_norm.weight"},
      {"model.layers.4.self_attn.k_norm.weight", "blocks.4.attn.k_norm.weight"},
  };
  for (const auto& [hf, ours] : pairs) {
    EXPECT_EQ(thetad_name_of_hf(hf), ours) << hf;
    EXPECT_EQ(hf_name_of_thetad(ours), hf) << ours;
  }
  for (const char* other : {"model.layers.0.self_attn.rotary_emb.inv_freq", "model.layers.x.mlp.up_proj.weight",
                            "model.layers.01.mlp.up_proj.weight", "model.layers..mlp.up_proj.weight", "pos.weight",
                            "model.layers.0.self_attn.o_proj.bias", "model.layers.0.mlp.up_proj.bias"}) {
    EXPECT_EQ(thetad_name_of_hf(other), "") << other;
    EXPECT_EQ(hf_name_of_thetad(other), "") << other;
  }
}

}  // namespace
}  // namespace thetad::daemon
