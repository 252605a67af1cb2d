// A checkpoint's parameter layout, as its manifest records it: the job keys that shape the
// parameters or change the function they compute (with their values), every group's parameter
// names and shapes (groups 0 and 1 in full, all of them in a digest), so that resume refuses a
// checkpoint written for another layout or model, whatever key changed it, naming that key,
// instead of cutting its flat values at the wrong places or training them as another function.
// Torch-free (parsed with the manifest, fuzzed).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/job.hpp"

namespace thetad::daemon {

struct LayoutParam {
  std::string name;
  std::vector<int64_t> shape;
  bool operator==(const LayoutParam& o) const { return name == o.name && shape == o.shape; }
};

struct ManifestLayout {
  bool present = false;  // checkpoints before this release have none
  std::vector<std::pair<std::string, std::string>> keys;  // layout key -> its value in the job
  std::vector<std::vector<LayoutParam>> groups;  // the first kLayoutGroupsInFull groups, in full
  uint64_t digest = 0;  // FNV-1a over every group's parameter names and shapes, in order
};

// Groups described by name and shape in the manifest (Θ and the first task group: every task
// group of a built-in model has the same form); the others are in the digest.
constexpr size_t kLayoutGroupsInFull = 2;

// The job keys whose value shapes the parameters (names, shapes, groups, row shards: the model's
// dimensions, the TorchScript file and patterns, LoRA's rank and targets, offload.shard_mb) or
// changes the function they compute (lora.alpha, model.arch, model.kv_heads, model.head_dim,
// model.rope_theta and the model.rope_* keys of its scaling, model.norm_eps,
// model.tie_embeddings). Every key a layout depends on is here (tests/integration/layout_resume.sh
// and test_checkpoint_sources.cpp change them one by one); a key missing from it is still
// caught by the digest (shapes) or the model hash (model.* keys), though not named.
const std::vector<std::string>& layout_keys();
// The layout keys that apply to `job`'s model (LoRA's only for the transformer, shard_mb only
// for the extreme classifier) with their values as the job's fingerprint writes them.
std::vector<std::pair<std::string, std::string>> layout_key_values(const config::Job& job);

// Builds a layout group by group: add(group, name, shape) in registration order.
class LayoutBuilder {
 public:
  explicit LayoutBuilder(const config::Job& job);
  void add(int group, const std::string& name, const std::vector<int64_t>& shape);
  ManifestLayout take();

 private:
  ManifestLayout layout_;
  int last_group_ = -1;
};

// Throws ConfigError "<path>: layout: ..." naming the first difference: a key ("model.hidden is 32
// in the checkpoint, 16 in this job"), else the first parameter whose name or shape differs.
// A checkpoint without a layout passes (its value counts are checked per group).
void check_layout(const ManifestLayout& saved, const ManifestLayout& job, const std::string& path);

// "[32, 16]".
std::string shape_text(const std::vector<int64_t>& shape);

}  // namespace thetad::daemon
