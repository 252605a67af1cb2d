// A checkpoint's parameter layout (see layout.hpp): the keys that shape it, its description and
// the comparison that names the first difference.
#include "daemon/checkpoint_format/layout.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "comm/bucket_plan.hpp"
#include "common/errors.hpp"
#include "config/loader.hpp"

namespace thetad::daemon {
namespace {

// The digest as the manifest writes it (16 hex digits).
std::string digest_text(uint64_t d) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(d));
  return buf;
}

std::string param_text(const LayoutParam& p) { return "'" + p.name + "' " + shape_text(p.shape); }

[[noreturn]] void refuse(const std::string& path, const std::string& what) {
  throw ConfigError(path + ": layout: " + what +
                    "; a checkpoint resumes only onto the parameter layout it was written for (set it back, "
                    "or start anew with --no-resume or another checkpoint.dir)");
}

}  // namespace

const std::vector<std::string>& layout_keys() {
  // The keys that shape the parameters, then those that change what the same parameters compute
  // (LoRA's scale alpha / rank, the transformer's architecture, its attention's key/value heads,
  // head width, rotary base and scaling, norm epsilon and tied embeddings): a checkpoint trained
  // under one of those is another model under another value, and resuming it would train on
  // silently.
  static const std::vector<std::string> keys = {
      "model.kind",   "model.input_dim", "model.hidden",       "model.output_dim", "model.trunk_layers",
      "model.head_layers", "model.tasks", "model.adapter_rank", "model.classes",   "model.path",
      "model.shared", "model.task",      "model.layers",       "model.d_model",    "model.heads",
      "model.d_ff",   "model.vocab",     "model.seq_len",      "lora.rank",        "lora.targets",
      "offload.shard_mb", "lora.alpha",  "model.arch",         "model.kv_heads",   "model.rope_theta",
      "model.norm_eps", "model.tie_embeddings", "model.head_dim", "model.rope_scaling", "model.rope_factor",
      "model.rope_low_freq_factor", "model.rope_high_freq_factor", "model.rope_original_max_positions"};
  return keys;
}

std::vector<std::pair<std::string, std::string>> layout_key_values(const config::Job& job) {
  const bool transformer = job.model.kind == config::ModelKind::Transformer;
  const bool classifier = job.model.kind == config::ModelKind::ExtremeClassifier;
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(config::fingerprint(job));
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq);
    const auto& keys = layout_keys();
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) continue;
    if (key.rfind("lora.", 0) == 0 && !transformer) continue;
    if (key == "offload.shard_mb" && !classifier) continue;
    out.emplace_back(key, line.substr(eq + 1));
  }
  return out;
}

LayoutBuilder::LayoutBuilder(const config::Job& job) {
  layout_.present = true;
  layout_.keys = layout_key_values(job);
  layout_.digest = comm::fnv1a64("", 0);
}

void LayoutBuilder::add(int group, const std::string& name, const std::vector<int64_t>& shape) {
  THETAD_CHECK(group >= last_group_, InternalError, "layout: group ", group, " after group ", last_group_);
  // The group number is hashed with every parameter: a parameter moved to another group changes it.
  const int64_t g = group;
  uint64_t& d = layout_.digest;
  d = comm::fnv1a64(&g, sizeof g, d);
  d = comm::fnv1a64(name, d);
  const int64_t rank = static_cast<int64_t>(shape.size());
  d = comm::fnv1a64(&rank, sizeof rank, d);
  if (!shape.empty()) d = comm::fnv1a64(shape.data(), shape.size() * sizeof(int64_t), d);
  if (static_cast<size_t>(group) < kLayoutGroupsInFull) {
    if (layout_.groups.size() <= static_cast<size_t>(group)) layout_.groups.resize(static_cast<size_t>(group) + 1);
    layout_.groups[static_cast<size_t>(group)].push_back({name, shape});
  }
  last_group_ = group;
}

ManifestLayout LayoutBuilder::take() { return std::move(layout_); }

void check_layout(const ManifestLayout& saved, const ManifestLayout& job, const std::string& path) {
  if (!saved.present || !job.present) return;
  const auto find = [](const ManifestLayout& l, const std::string& key) {
    return std::find_if(l.keys.begin(), l.keys.end(), [&](const auto& kv) { return kv.first == key; });
  };
  for (const auto& kv : job.keys) {
    const auto it = find(saved, kv.first);
    if (it != saved.keys.end() && it->second != kv.second)
      refuse(path, kv.first + " is " + it->second + " in the checkpoint, " + kv.second + " in this job");
  }
  // A key this job does not record (another model kind's) that the checkpoint does.
  for (const auto& kv : saved.keys)
    if (find(job, kv.first) == job.keys.end())
      refuse(path, kv.first + " is " + kv.second + " in the checkpoint, and does not apply to this job's model");
  if (saved.digest == job.digest) return;
  for (size_t g = 0; g < std::max(saved.groups.size(), job.groups.size()); ++g) {
    static const std::vector<LayoutParam> none;
    const auto& a = g < saved.groups.size() ? saved.groups[g] : none;
    const auto& b = g < job.groups.size() ? job.groups[g] : none;
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
      const std::string where = "group " + std::to_string(g) + " parameter " + std::to_string(i) + " is ";
      if (i >= a.size()) refuse(path, where + "absent in the checkpoint, " + param_text(b[i]) + " in this job");
      if (i >= b.size()) refuse(path, where + param_text(a[i]) + " in the checkpoint, absent in this job");
      if (!(a[i] == b[i])) refuse(path, where + param_text(a[i]) + " in the checkpoint, " + param_text(b[i]) + " in this job");
    }
  }
  refuse(path, "the parameters' names or shapes of a group after group " + std::to_string(kLayoutGroupsInFull - 1) +
                   " differ (digest " + digest_text(saved.digest) + " in the checkpoint, " + digest_text(job.digest) + " in this job)");
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace thetad::daemon
