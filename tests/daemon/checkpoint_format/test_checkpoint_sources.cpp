// What makes a checkpoint resume onto the model it was written for, torch-free: the layout keys
// (daemon/checkpoint_format/layout.hpp: every key that changes what the parameters compute, lora.alpha
// included), the plan of an incremental checkpoint (daemon/state/checkpoint_plan.hpp: runs by
// file and step count, damaged files never shared) and the sources of unstored groups
// (daemon/checkpoint_format/init_sources.hpp).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/errors.hpp"
#include "config/loader.hpp"
#include "daemon/checkpoint_format/file_checksum.hpp"
#include "daemon/checkpoint_format/init_sources.hpp"
#include "daemon/checkpoint_format/layout.hpp"
#include "daemon/state/checkpoint_plan.hpp"
#include "tests/daemon/test_util.hpp"

namespace thetad::daemon {
namespace {

config::Job transformer(const std::string& extra) {
  return config::load_job_from_string(
      "job: tfm\nsteps: 4\nmodel: {kind: transformer, layers: 2, d_model: 16, heads: 2, d_ff: 32, vocab: 24, "
      "seq_len: 8, tasks: 4" + extra + "}\nlora: {rank: 2, alpha: 4, targets: [q, v]}\ndata: {kind: synthetic, "
      "batch_per_rank: 8}\n", "job.yaml");
}

ManifestLayout layout_of(const config::Job& job) {
  LayoutBuilder b(job);
  b.add(0, "embed", {24, 16});
  b.add(1, "lora.0.0.q.a", {2, 16});
  return b.take();
}

std::string refusal(const ManifestLayout& saved, const ManifestLayout& now) {
  try {
    check_layout(saved, now, "ck/manifest.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// Keys that change what the same parameters compute are recorded and refused by name.
TEST(CheckpointLayout, FunctionKeysAreRecordedAndRefusedByName) {
  const config::Job base = transformer("");
  const ManifestLayout saved = layout_of(base);
  for (const char* key : {"lora.alpha", "model.arch", "model.kv_heads", "model.rope_theta", "model.norm_eps",
                          "model.tie_embeddings", "model.head_dim", "model.rope_scaling", "model.rope_factor",
                          "model.rope_low_freq_factor", "model.rope_high_freq_factor",
                          "model.rope_original_max_positions"}) {
    bool found = false;
    for (const auto& kv : saved.keys) found |= kv.first == key;
    EXPECT_TRUE(found) << key << " is not among the layout keys";
  }
  config::Job alpha = base;
  alpha.lora.alpha = 8;
  EXPECT_NE(refusal(saved, layout_of(alpha)).find("ck/manifest.json: layout: lora.alpha is 4 in the checkpoint, 8 in this job"),
            std::string::npos) << refusal(saved, layout_of(alpha));
  config::Job eps = base;
  eps.model.norm_eps = 1e-6;
  EXPECT_NE(refusal(saved, layout_of(eps)).find("model.norm_eps is"), std::string::npos);
  config::Job rope = base;  // Llama 3's frequencies are another function of the same weights
  rope.model.rope_scaling = config::RopeScaling::Llama3;
  EXPECT_NE(refusal(saved, layout_of(rope)).find("model.rope_scaling is none in the checkpoint, llama3 in this job"),
            std::string::npos) << refusal(saved, layout_of(rope));
  config::Job lr = base;  // what only trains differently is no layout key
  lr.optimizer.lr = 0.5;
  EXPECT_EQ(refusal(saved, layout_of(lr)), "");
  // A checkpoint written before lora.alpha was recorded resumes as before.
  ManifestLayout older = saved;
  older.keys.erase(std::remove_if(older.keys.begin(), older.keys.end(), [](const auto& kv) { return kv.first == "lora.alpha"; }),
                   older.keys.end());
  EXPECT_EQ(refusal(older, layout_of(alpha)), "");
}

// Groups: 0 (Θ), 1..4. The previous checkpoint's files: 0 holds Θ, 1 holds groups 1..4.
CheckpointPlan previous() {
  CheckpointPlan p = plan_checkpoint(nullptr, {120, 12, 12, 12, 12}, {4, 1, 1, 1, 1}, std::vector<GroupSource>(5, GroupSource::values));
  p.dir = "ck/step-00000004";
  return p;
}

TEST(CheckpointPlan, RunsRecordEachGroupsStepCount) {
  const CheckpointPlan prev = previous();
  ASSERT_EQ(prev.manifest.files.size(), 2u);
  const CheckpointPlan p = plan_checkpoint(&prev, {120, 12, 12, 12, 12}, {6, 1, 2, 1, 1}, std::vector<GroupSource>(5, GroupSource::values));
  // Θ and group 2 written anew; groups 1, 3, 4 still in the shared file, each run one step count.
  ASSERT_EQ(p.manifest.runs.size(), 4u);
  EXPECT_EQ(p.manifest.runs[0].steps, 6);
  EXPECT_EQ(p.manifest.runs[1].first, 1);
  EXPECT_EQ(p.manifest.runs[1].steps, 1);
  EXPECT_EQ(p.manifest.runs[2].first, 2);
  EXPECT_EQ(p.manifest.runs[2].steps, 2);
  EXPECT_EQ(p.manifest.runs[3].first, 3);
  EXPECT_EQ(p.manifest.runs[3].count, 2);
  EXPECT_EQ(p.shared_files, 1);
  const CheckpointPlan initial =
      plan_checkpoint(nullptr, {120, 0, 12}, {3, 0, 3}, {GroupSource::values, GroupSource::initial, GroupSource::values});
  ASSERT_EQ(initial.manifest.runs.size(), 3u);
  EXPECT_EQ(initial.manifest.runs[1].file, kRunInitial);
  EXPECT_EQ(initial.manifest.runs[1].steps, 0);
}

// A file found damaged when it was to be shared is never shared again: its current groups are
// written anew (from training's state), so that the damage stays in the checkpoints it is in.
TEST(CheckpointPlan, DamagedFilesAreWrittenAnewNotShared) {
  CheckpointPlan prev = previous();
  prev.damaged = {0, 1};
  const CheckpointPlan p = plan_checkpoint(&prev, {120, 12, 12, 12, 12}, {6, 1, 2, 1, 1}, std::vector<GroupSource>(5, GroupSource::values));
  EXPECT_EQ(p.shared_files, 0);
  for (const ManifestFile& f : p.manifest.files) EXPECT_NE(f.file, "shard-00001.pt");
  EXPECT_EQ(p.written_bytes, 120 + 4 * 12);
}

InitSourcesNow now_of(const std::string& pattern, uint64_t seed) {
  InitSourcesNow n;
  n.seed = seed;
  n.seed_key = "seed";
  n.lora_pattern = pattern;
  n.lora_dir = [pattern](int64_t t) {
    std::string s = pattern;
    return s.replace(s.find("{task}"), 6, std::to_string(t));
  };
  return n;
}

std::string init_refusal(const Manifest& m, const InitSourcesNow& now) {
  try {
    check_init_sources(m, now, "ck/manifest.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// offload.host_groups: scheduled with lora.init_from: task groups never trained are not stored;
// resume reads them again from their adapter directories, which must be as they were.
TEST(InitSources, ChangedMissingOrNewAdapterDirectoriesAreRefused) {
  test::ScratchDir dir;
  const std::string pattern = dir.file("ad/{task}");
  std::filesystem::create_directories(dir.file("ad/1"));
  std::ofstream(dir.file("ad/1/adapter_model.safetensors")) << "weights";
  Manifest m;
  m.format = kManifestFormat;
  m.num_groups = 4;
  m.runs = {{0, 1, 0, 3}, {1, 3, kRunInitial, 0}};  // tasks 0, 1, 2 never trained
  m.init.has_seed = true;
  m.init.seed = 7;
  m.init.lora_pattern = pattern;
  const InitSourcesNow now = now_of(pattern, 7);
  for (int64_t t = 0; t < 3; ++t) m.init.lora.push_back({t, fingerprint_path(now.lora_dir(t), "lora.init_from")});
  EXPECT_FALSE(m.init.lora[0].print.present);
  EXPECT_TRUE(m.init.lora[1].print.present);
  EXPECT_EQ(init_refusal(m, now), "");
  EXPECT_NE(init_refusal(m, now_of(pattern, 8)).find("were drawn from seed 7; this job's seed gives 8"), std::string::npos);
  EXPECT_NE(init_refusal(m, now_of(dir.file("other/{task}"), 7)).find("take their values from lora.init_from"),
            std::string::npos);
  std::ofstream(dir.file("ad/1/adapter_model.safetensors")) << "other weights";
  EXPECT_NE(init_refusal(m, now).find("ad/1: lora.init_from: changed since the checkpoint ck/manifest.json relied on it "
                                      "for task 1"), std::string::npos) << init_refusal(m, now);
  std::filesystem::remove_all(dir.file("ad/1"));
  EXPECT_NE(init_refusal(m, now).find("ad/1: lora.init_from: gone since"), std::string::npos);
  m.init.lora[1].print = {false, "", 0, 0};
  std::filesystem::create_directories(dir.file("ad/2"));
  EXPECT_NE(init_refusal(m, now).find("ad/2: lora.init_from: created since"), std::string::npos);
}

TEST(InitSources, ModelInitFromIsFingerprinted) {
  test::ScratchDir dir;
  const std::string base = dir.file("base.pt");
  std::ofstream(base) << "base";
  Manifest m;
  m.format = kManifestFormat;
  m.num_groups = 2;
  m.runs = {{0, 1, kRunInitFrom, 0}, {1, 1, 0, 2}};
  m.init.has_seed = true;
  m.init.model = fingerprint_path(base, "model.init_from");
  InitSourcesNow now = now_of("", 0);
  now.model_path = base;
  EXPECT_EQ(init_refusal(m, now), "");
  std::ofstream(base, std::ios::app) << "more";
  EXPECT_NE(init_refusal(m, now).find("base.pt: model.init_from: changed since the checkpoint"), std::string::npos);
  std::filesystem::remove(base);
  EXPECT_NE(init_refusal(m, now).find("model.init_from: gone since"), std::string::npos);
}

// A Hugging Face base directory: only the files a run reads count. A file created or removed
// beside them (a tokenizer, thetad's own metrics) blocks no resume; a changed weight file is named;
// a checkpoint's earlier fingerprint (every file and the directory's mtime) is still accepted.
TEST(InitSources, ABaseDirectoryIsFingerprintedByTheFilesRead) {
  test::ScratchDir dir;
  const std::string base = dir.file("base");
  std::filesystem::create_directories(base);
  std::ofstream(base + "/config.json") << "{}";
  std::ofstream(base + "/model.safetensors") << "weights";
  Manifest m;
  m.format = kManifestFormat;
  m.num_groups = 2;
  m.runs = {{0, 1, kRunInitFrom, 0}, {1, 1, 0, 2}};
  m.init.has_seed = true;
  m.init.model = fingerprint_path(base, "model.init_from");
  InitSourcesNow now = now_of("", 0);
  now.model_path = base;
  std::ofstream(base + "/notes.txt") << "mine";
  std::ofstream(base + "/metrics.jsonl") << "{}";
  EXPECT_EQ(init_refusal(m, now), "");
  std::filesystem::remove(base + "/notes.txt");
  EXPECT_EQ(init_refusal(m, now), "");
  const InitFromPrint earlier = fingerprint_path(base, "model.init_from", /*legacy=*/true);
  m.init.model = earlier;
  EXPECT_EQ(init_refusal(m, now), "") << "the earlier fingerprint of the same files";
  m.init.model = fingerprint_path(base, "model.init_from");
  std::ofstream(base + "/model.safetensors", std::ios::app) << "!";
  std::filesystem::last_write_time(base + "/model.safetensors",  // past the coarse clock's granularity
                                   std::filesystem::last_write_time(base + "/model.safetensors") + std::chrono::seconds(5));
  const std::string refusal = init_refusal(m, now);
  EXPECT_NE(refusal.find("base: model.init_from: changed since the checkpoint"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("written since: model.safetensors"), std::string::npos) << refusal;
}

// What publish verifies a shared file with before linking it: its blocks read from the file on
// several threads hash to the checksum of its bytes; a file shorter than it should be is no match.
TEST(FileChecksum, OfADescriptorIsTheChecksumOfItsBytes) {
  test::ScratchDir dir;
  std::string bytes(9 * 1024 * 1024 + 3, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 2654435761u >> 13);
  std::ofstream(dir.file("f"), std::ios::binary) << bytes;
  const int fd = ::open(dir.file("f").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  uint64_t sum = 0;
  ASSERT_TRUE(file_checksum_of_fd(fd, bytes.size(), 3, &sum));
  EXPECT_EQ(sum, file_checksum(bytes.data(), bytes.size(), 1));
  EXPECT_FALSE(file_checksum_of_fd(fd, bytes.size() + 10, 3, &sum));
  ::close(fd);
}

}  // namespace
}  // namespace thetad::daemon
