// The checkpoint manifest (daemon/checkpoint_format/manifest.hpp): format 6's checksum of its own
// text, each run's step count, the sources of unstored groups ("init"), the names of step
// directories for any step count, format 5 still read; manifests as earlier releases wrote them
// (fixtures/: format 6 with its checksum, format 5 without, from the hand-made writer that came
// before nlohmann's) parse, byte for byte as they are on disk, to the same manifest; and what is
// read is JSON only (the parser before was YAML's, which took more than JSON), its nesting bounded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/errors.hpp"
#include "daemon/checkpoint_format/manifest.hpp"

namespace thetad::daemon {
namespace {

// Three files; group 3's current values are in files[1], its stale ones still in files[0]
// (shared from an older checkpoint, as incremental checkpoints do).
Manifest example() {
  Manifest m;
  m.job = "small";
  m.job_hash = "0123456789abcdef";
  m.step = 8;
  m.world_size = 2;
  m.num_groups = 6;
  m.files = {{"shard-00001.pt", 1200, 0x1111}, {"shard-00004.pt", 600, 0x2222}, {"shard-00005.pt", 120, 0x3333}};
  m.runs = {{0, 1, 2, 8}, {1, 2, 0, 3}, {3, 1, 1, 7}, {4, 1, kRunInitial, 0}, {5, 1, 0, 2}};
  m.init.has_seed = true;
  m.init.seed = 11;
  m.init.lora_pattern = "adapters/{task}";
  m.init.lora = {{3, {true, "", 4096, 1700000000000000000}}};
  return m;
}

std::string replace_once(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

std::string fixture(const std::string& name) {
  std::ifstream in(THETAD_SOURCE_DIR "/tests/daemon/checkpoint_format/fixtures/" + name, std::ios::binary);
  EXPECT_TRUE(in.good()) << name;
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::string refusal(const std::string& text) {
  try {
    parse_manifest(text, "ck/step-00000008/manifest.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Manifest, Format6RoundTripsWithItsChecksumLast) {
  const std::string text = manifest_json(example());
  EXPECT_NE(text.find("\"format\": \"thetad-checkpoint-6\""), std::string::npos);
  const size_t key = text.rfind("\"checksum\": \"");
  ASSERT_NE(key, std::string::npos);
  EXPECT_EQ(text.substr(key + 29), "\"\n}\n");  // the last key
  const Manifest m = parse_manifest(text, "m.json");
  ASSERT_EQ(m.runs.size(), 5u);
  EXPECT_EQ(m.runs[2].file, 1);
  EXPECT_EQ(m.runs[2].steps, 7);
  EXPECT_EQ(m.runs[0].steps, 8);
  EXPECT_TRUE(m.init == example().init) << text;
  EXPECT_EQ(manifest_json(m), text);
}

// One bit of a run's file index flipped ([3, 1, 1] -> [3, 1, 0]): group 3 would resume from the
// stale values file 0 still holds. The manifest's own checksum refuses it.
TEST(Manifest, FlippedRunFileIsRefusedByTheChecksum) {
  const std::string text = manifest_json(example());
  const std::string flipped = replace_once(text, "[3, 1, 1, 7]", "[3, 1, 0, 7]");
  const std::string why = refusal(flipped);
  EXPECT_NE(why.find("ck/step-00000008/manifest.json: checksum: the manifest's text hashes to"), std::string::npos) << why;
  EXPECT_NE(why.find("changed or damaged after it was written"), std::string::npos) << why;
  // Any other byte too, and the checksum itself.
  EXPECT_NE(refusal(replace_once(text, "\"step\": 8", "\"step\": 9")).find("checksum"), std::string::npos);
  const size_t at = text.rfind("\"checksum\": \"") + 13;
  std::string sum = text;
  sum[at] = sum[at] == '0' ? '1' : '0';
  EXPECT_NE(refusal(sum).find("checksum"), std::string::npos);
}

TEST(Manifest, ChecksumMustBeThereAndLast) {
  const std::string text = manifest_json(example());
  const size_t key = text.rfind(",\n  \"checksum\"");
  EXPECT_NE(refusal(text.substr(0, key) + "\n}\n").find("checksum: missing"), std::string::npos);
  EXPECT_NE(refusal(text.substr(0, text.size() - 3) + ", \"x\": 1\n}\n").find("checksum: not the manifest's last key"),
            std::string::npos);
  EXPECT_NE(refusal(replace_once(text, "\"checksum\": \"", "\"checksum\": \"zz")).find("checksum"), std::string::npos);
}

// A manifest rewritten with a recomputed checksum is still checked key by key: each run's steps
// within the checkpoint's, none for groups stored nowhere, "init" matching the runs.
TEST(Manifest, RunStepsAndInitAreChecked) {
  const auto sealed = [](std::string text) {
    const size_t key = text.rfind("\"checksum\"");
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx",
                  static_cast<unsigned long long>(manifest_text_checksum(text.substr(0, key))));
    return text.substr(0, key) + "\"checksum\": \"" + hex + "\"\n}\n";
  };
  const std::string text = manifest_json(example());
  EXPECT_EQ(refusal(sealed(text)), "");
  EXPECT_NE(refusal(sealed(replace_once(text, "[3, 1, 1, 7]", "[3, 1, 1, 9]"))).find("runs[2][3]: 9 is outside [0, 8]"),
            std::string::npos);
  EXPECT_NE(refusal(sealed(replace_once(text, "[4, 1, -1, 0]", "[4, 1, -1, 2]"))).find("steps for groups stored nowhere"),
            std::string::npos);
  EXPECT_NE(refusal(sealed(replace_once(text, "[3, 1, 1, 7]", "[3, 1, 1]"))).find("not [first, count, file, steps]"),
            std::string::npos);
  // Group 4 (task 3) is initial: its lora.init_from directory must be listed, and only it.
  EXPECT_NE(refusal(sealed(replace_once(text, "\"tasks\": [[3,", "\"tasks\": [[2,"))).find("task 2 where the runs' next initial"),
            std::string::npos);
  EXPECT_NE(refusal(sealed(replace_once(text, "[4, 1, -1, 0]", "[4, 1, 0, 0]"))).find("init: present where no run"),
            std::string::npos);
}

// Formats 5 and 4 (no checksum of the manifest, runs of three) are still read.
TEST(Manifest, Format5IsStillRead) {
  Manifest m = example();
  m.format = kManifestFormatV5;
  for (ManifestRun& r : m.runs) r.steps = -1;
  m.init = {};
  const std::string text = manifest_json(m);
  EXPECT_EQ(text.find("checksum"), std::string::npos);
  const Manifest back = parse_manifest(text, "m.json");
  EXPECT_EQ(back.format, kManifestFormatV5);
  EXPECT_EQ(back.runs[2].steps, -1);
  EXPECT_TRUE(has_block_checksums(back.format));
  EXPECT_NE(refusal(replace_once(text, "[3, 1, 1]", "[3, 1, 1, 7]")).find("not [first, count, file]"), std::string::npos);
}

// Step 10^8 is "step-100000000": the name the writer gives every step reads back as that step.
TEST(Manifest, StepDirectoryNamesRoundTripForAnyStep) {
  for (const int64_t step : {int64_t{0}, int64_t{40}, int64_t{99999999}, int64_t{100000000}, int64_t{123456789012},
                             kMaxStep}) {
    EXPECT_EQ(step_of_dir_name(step_dir_name(step)), step) << step_dir_name(step);
  }
  EXPECT_EQ(step_dir_name(100000000), "step-100000000");
  EXPECT_EQ(step_dir_name(40), "step-00000040");
  for (const char* name : {"step-0000040", "step-000000040", "step-00000040x", "step-", "xstep-00000040", "step-+0000040",
                           "step-99999999999999999999", "step-4611686018427387905", ".tmp-step-00000040"})
    EXPECT_EQ(step_of_dir_name(name), -1) << name;
}

// The fuzzer's seeds named valid-* are manifests this release reads (format 6's with a checksum
// that matches): the fuzzer starts from inputs that reach every key.
TEST(Manifest, FuzzSeedsNamedValidParse) {
  int seen = 0;
  for (const auto& e : std::filesystem::directory_iterator(THETAD_SOURCE_DIR "/tests/fuzz/corpus/manifest")) {
    if (e.path().filename().string().rfind("valid", 0) != 0) continue;
    std::ifstream in(e.path());
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_EQ(refusal(text.str()), "") << e.path();
    ++seen;
  }
  EXPECT_GE(seen, 4);
}

// What both fixtures hold besides their format's own keys.
void expect_common(const Manifest& m) {
  EXPECT_EQ(m.job, "small");
  EXPECT_EQ(m.job_hash, "0123456789abcdef");
  EXPECT_EQ(m.step, 8);
  EXPECT_EQ(m.world_size, 2);
  EXPECT_EQ(m.num_groups, 7);
  ASSERT_EQ(m.files.size(), 2u);
  EXPECT_EQ(m.files[0].file, "shard-00001.pt");
  EXPECT_EQ(m.files[0].bytes, 1200);
  EXPECT_EQ(m.files[0].fnv1a64, 0x1111222233334444ULL);
  EXPECT_EQ(m.files[1].file, "shard-00004.pt");
  EXPECT_EQ(m.files[1].fnv1a64, 0xfedcba9876543210ULL);
  ASSERT_TRUE(m.layout.present);
  EXPECT_EQ(m.layout.digest, 0x0123456789abcdefULL);
  ASSERT_EQ(m.layout.keys.size(), 3u);
  const auto kind = std::find_if(m.layout.keys.begin(), m.layout.keys.end(), [](const auto& kv) { return kv.first == "model.kind"; });
  ASSERT_NE(kind, m.layout.keys.end());
  EXPECT_EQ(kind->second, "multitask_mlp");
  ASSERT_EQ(m.layout.groups.size(), 2u);
  ASSERT_EQ(m.layout.groups[0].size(), 2u);
  EXPECT_EQ(m.layout.groups[0][0].name, "trunk.0.weight");
  EXPECT_EQ(m.layout.groups[0][0].shape, (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(m.layout.groups[1][1].name, "heads.0.0.bias");
}

TEST(ManifestCompat, Format6AsWrittenBeforeStillParses) {
  const std::string text = fixture("manifest-v6.json");
  const Manifest m = parse_manifest(text, "manifest-v6.json");  // its checksum checked first
  EXPECT_EQ(m.format, kManifestFormat);
  expect_common(m);
  ASSERT_EQ(m.runs.size(), 5u);
  EXPECT_EQ(m.runs[0].file, kRunInitFrom);
  EXPECT_EQ(m.runs[2].first, 3);
  EXPECT_EQ(m.runs[2].file, 1);
  EXPECT_EQ(m.runs[2].steps, 8);
  EXPECT_EQ(m.runs[3].file, kRunInitial);
  EXPECT_EQ(m.runs[3].count, 2);
  EXPECT_TRUE(m.init.has_seed);
  EXPECT_EQ(m.init.seed, 18446744073709551615ULL);
  EXPECT_TRUE(m.init.model.present);
  EXPECT_EQ(m.init.model.path, "base/model \"q\".safetensors");
  EXPECT_EQ(m.init.model.mtime_ns, 1700000000000000000);
  EXPECT_EQ(m.init.lora_pattern, "adapters/{task}");
  ASSERT_EQ(m.init.lora.size(), 2u);
  EXPECT_EQ(m.init.lora[0].print.size, 4096);
  EXPECT_FALSE(m.init.lora[1].print.present);
  // Written again by this release: the same manifest, its own checksum.
  const Manifest again = parse_manifest(manifest_json(m), "again.json");
  EXPECT_TRUE(again.init == m.init);
  EXPECT_EQ(again.runs.size(), m.runs.size());
  EXPECT_EQ(again.layout.keys, m.layout.keys);
  // The fixture's checksum covers its bytes: one changed is refused.
  EXPECT_NE(refusal(replace_once(text, "[3, 1, 1, 8]", "[3, 1, 0, 8]")).find("checksum: the manifest's text hashes to"),
            std::string::npos);
}

TEST(ManifestCompat, Format5AsWrittenBeforeStillParses) {
  const Manifest m = parse_manifest(fixture("manifest-v5.json"), "manifest-v5.json");
  EXPECT_EQ(m.format, kManifestFormatV5);
  expect_common(m);
  ASSERT_EQ(m.runs.size(), 5u);
  for (const ManifestRun& r : m.runs) EXPECT_EQ(r.steps, -1);
  EXPECT_EQ(m.runs[0].file, kRunInitFrom);
  EXPECT_FALSE(m.init.has_seed);
  EXPECT_TRUE(m.init.model.present);
  EXPECT_EQ(m.init.model.path, "base/model.safetensors");
  EXPECT_EQ(m.init.model.mtime_ns, -5);
  const Manifest again = parse_manifest(manifest_json(m), "again.json");
  EXPECT_TRUE(again.init == m.init);
  EXPECT_EQ(again.runs.size(), m.runs.size());
}

// YAML's flow style took these as the manifest they look like; JSON does not: a word without
// quotes, quotes of the other kind, a comment, a number in quotes (a string, not a step count).
TEST(ManifestCompat, OnlyJsonIsRead) {
  const std::string text = fixture("manifest-v5.json");
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"job\": \"small\"", "\"job\": small"},
           {"\"job\": \"small\"", "\"job\": 'small'"},
           {"\"step\": 8,", "\"step\": 8, # eight\n"},
           {"{\n", "--- {\n"}}) {
    const std::string why = refusal(replace_once(text, from, to));
    EXPECT_NE(why.find("manifest.json: manifest: not valid JSON"), std::string::npos) << to << ": " << why;
  }
  const std::string quoted = refusal(replace_once(text, "\"step\": 8", "\"step\": \"8\""));
  EXPECT_NE(quoted.find("manifest.json: step: \"8\" is not an integer"), std::string::npos) << quoted;
  const std::string hex = refusal(replace_once(text, "\"fnv1a64\": \"1111222233334444\"", "\"fnv1a64\": 1111222233334444"));
  EXPECT_NE(hex.find("files[0].fnv1a64: 1111222233334444 is not a string"), std::string::npos) << hex;
}

// A manifest nested far deeper than any thetad writes (4 levels) is refused by its depth, before
// anything recurses over it.
TEST(ManifestCompat, NestingIsBounded) {
  const size_t depth = 100000;
  const std::string text = "{\"format\": \"thetad-checkpoint-5\", \"layout\": " + std::string(depth, '[') +
                           std::string(depth, ']') + "}";
  const std::string why = refusal(text);
  EXPECT_NE(why.find("manifest.json: manifest: nested deeper than 64 levels"), std::string::npos) << why.substr(0, 200);
}

}  // namespace
}  // namespace thetad::daemon
