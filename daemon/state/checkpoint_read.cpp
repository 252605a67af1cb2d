// Reading checkpoints: the manifest checked once, each file (formats 4 to 6), shard (format 3) or
// group file (formats 1 and 2) checked against its checksum before it is unpickled; the model's layout restored
// (checkpoint.hpp).

#include <cerrno>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <map>
#include <sstream>

#include "comm/bucket_plan.hpp"
#include "common/errors.hpp"
#include "common/text.hpp"
#include "common/thread_pool.hpp"
#include "daemon/checkpoint_format/file_checksum.hpp"
#include "daemon/checkpoint_format/manifest.hpp"
#include "daemon/hf/pt_dict.hpp"
#include "daemon/state/checkpoint.hpp"
#include "daemon/state/checkpoint_files.hpp"

namespace fs = std::filesystem;

namespace thetad::daemon {
namespace {

// Whether a host tensor holds only finite values (a plain loop: checkpoints of a million tiny
// tensors cannot afford a LibTorch reduction per tensor).
bool all_finite(const at::Tensor& t) {
  if (t.scalar_type() != at::kFloat) return torch::isfinite(t).all().item<bool>();
  const at::Tensor c = t.contiguous();
  const float* v = c.data_ptr<float>();
  bool finite = true;
  for (int64_t i = 0, n = c.numel(); i < n; ++i) finite &= std::isfinite(v[i]);
  return finite;
}

// The index of the first value that is NaN, Inf or (with `nonneg`) below zero, or -1.
int64_t first_bad(const at::Tensor& t, bool nonneg) {
  // A shard's narrowed slices are float32 and contiguous: no LibTorch operation per group.
  const at::Tensor c = t.scalar_type() == at::kFloat && t.is_contiguous() ? t : t.to(at::kFloat).contiguous();
  const float* v = c.data_ptr<float>();
  for (int64_t i = 0, n = c.numel(); i < n; ++i)
    if (!std::isfinite(v[i]) || (nonneg && v[i] < 0)) return i;
  return -1;
}

// A file's checksum as its manifest's format takes it: formats 5 and 6, of 4 MiB blocks (hashed on
// the machine's cores); 4, over 64-bit words; 2 and 3, over bytes.
uint64_t checksum_in_format(const std::string& format, const std::vector<char>& bytes) {
  if (has_block_checksums(format)) return file_checksum(bytes.data(), bytes.size(), static_cast<int>(cpu_share(1)));
  if (format == kManifestFormatV4) return comm::fnv1a64_words(bytes.data(), bytes.size());
  return comm::fnv1a64(bytes.data(), bytes.size());
}

}  // namespace

using ckpt_files::read_bytes;

// A loaded group's optimizer state as AdamW can use it: finite moments, second moments >= 0, a
// step count in 0..the checkpoint's step (a hand-edited file with a recomputed checksum passes
// the checksum; training on from it would fail later, blaming another key).
void CheckpointReader::check_state(const std::string& file, const GroupState& st) const {
  const std::string where = (fs::path(ckpt_.path) / file).string() + ": group " + std::to_string(st.group) + ": ";
  const std::string advice = " (the checkpoint is damaged; resume from an earlier checkpoint, or start anew with --no-resume)";
  if (st.steps < 0 || st.steps > ckpt_.step)
    throw ConfigError(where + "step count " + std::to_string(st.steps) + " outside 0.." + std::to_string(ckpt_.step) +
                      " (the checkpoint's step)" + advice);
  const char* keys[2] = {"exp_avg", "exp_avg_sq"};
  for (int k = 0; k < 2; ++k)
    for (size_t i = 0; i < st.params.size(); ++i) {
      const at::Tensor& t = k == 0 ? st.exp_avg[i] : st.exp_avg_sq[i];
      const int64_t bad = first_bad(t, k == 1);
      if (bad < 0) continue;
      const float v = t.reshape({-1})[bad].item<float>();
      throw ConfigError(where + keys[k] + (st.names.empty() ? "" : " of '" + printable(st.names[i]) + "'") + " value " +
                        std::to_string(bad) + " is " + std::to_string(v) +
                        (k == 1 ? ", where second moments are finite and >= 0" : ", where moments are finite") + advice);
    }
}

CheckpointReader::CheckpointReader(const CheckpointInfo& ckpt, int num_groups, const std::string& expected_job_hash,
                                   const ManifestLayout& layout)
    : ckpt_(ckpt) {
  const fs::path path = fs::path(ckpt.path) / "manifest.json";
  const std::vector<char> text = read_bytes(path);
  manifest_ = parse_manifest(std::string(text.begin(), text.end()), path.string());
  if (manifest_.step != ckpt.step)
    throw ConfigError(path.string() + ": step: " + std::to_string(manifest_.step) + " but the directory is of step " +
                      std::to_string(ckpt.step) + " (the checkpoint is damaged; use --no-resume or another "
                      "checkpoint.dir)");
  check_layout(manifest_.layout, layout, path.string());  // names the key: before the hash of them all
  if (!expected_job_hash.empty() && manifest_.job_hash != expected_job_hash)
    throw ConfigError(path.string() + ": checkpoint is of another model (job_hash " + manifest_.job_hash +
                      ", this job " + expected_job_hash + "); use --no-resume or another checkpoint.dir");
  if (num_groups >= 0 && manifest_.num_groups != num_groups)
    throw ConfigError(path.string() + ": groups: " + std::to_string(manifest_.num_groups) + " groups, this job has " +
                      std::to_string(num_groups) + " (use --no-resume or another checkpoint.dir)");
}

// A checkpoint file's bytes checked against the manifest's checksum, then read as a dict of
// tensors by thetad's strict reader (pt_dict.hpp: every tensor within its record; CRCs only where
// no checksum vouches for the bytes) (ConfigError naming the file otherwise).
c10::impl::GenericDict CheckpointReader::load_file(const std::string& name, bool has_checksum, uint64_t checksum) const {
  const fs::path file = fs::path(ckpt_.path) / name;  // a fixed name: parse_manifest allows no path
  auto bytes = std::make_shared<std::vector<char>>(read_bytes(file));
  if (has_checksum) {
    const uint64_t sum = checksum_in_format(manifest_.format, *bytes);
    if (sum != checksum) {
      std::ostringstream os;
      os << "checksum " << std::hex << std::setw(16) << std::setfill('0') << sum << " where manifest.json says "
         << std::setw(16) << checksum << " (" << std::dec << bytes->size() << " bytes)";
      throw damaged(name, os.str());
    }
  }
  try {
    return pt_dict(bytes, bytes->data(), bytes->size(), file.string(), /*check_crc=*/!has_checksum);
  } catch (const ConfigError& e) {
    const std::string what = e.what(), prefix = file.string() + ": ";
    throw damaged(name, what.compare(0, prefix.size(), prefix) == 0 ? what.substr(prefix.size()) : what);
  }
}

ConfigError CheckpointReader::damaged(const std::string& name, const std::string& what) const {
  return ConfigError((fs::path(ckpt_.path) / name).string() + ": " + what +
                     " (the checkpoint is damaged; use --no-resume or another checkpoint.dir)");
}

// A tensor of the dict by key (ConfigError naming the file and key where missing or another type).
at::Tensor CheckpointReader::tensor(const c10::impl::GenericDict& dict, const std::string& key,
                                    const std::string& file) const {
  auto it = dict.find(key);
  if (it == dict.end()) throw damaged(file, "key '" + printable(key) + "' missing");
  if (!it->value().isTensor()) throw damaged(file, "key '" + printable(key) + "' is not a tensor");
  return it->value().toTensor();
}

GroupState CheckpointReader::load_group(int group) const {
  THETAD_CHECK(group >= 0 && group < manifest_.num_groups, InternalError, "no group ", group, " in ", ckpt_.path);
  if (has_file_runs(manifest_.format)) return load_linked_group(group);
  return manifest_.shards.empty() ? load_group_file(group) : load_shard_group(group);
}

std::vector<int> CheckpointReader::load_order() const {
  std::vector<int> order(static_cast<size_t>(manifest_.num_groups));
  for (size_t g = 0; g < order.size(); ++g) order[g] = static_cast<int>(g);
  if (!has_file_runs(manifest_.format)) return order;
  // A file read once for all its groups: the groups by file (the initial ones first), then in order.
  std::vector<int64_t> file(order.size());
  for (const ManifestRun& r : manifest_.runs)
    std::fill(file.begin() + r.first, file.begin() + r.first + r.count, r.file);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return file[static_cast<size_t>(a)] < file[static_cast<size_t>(b)]; });
  return order;
}

// The file's dict as a shard: float32 values, int64 index keys (ConfigError naming the file).
void CheckpointReader::read_shard(const c10::impl::GenericDict& dict, const std::string& file, bool with_groups) const {
  const auto values = [&](const char* key) {
    at::Tensor t = tensor(dict, key, file);
    if (t.dim() != 1 || t.scalar_type() != at::kFloat) throw damaged(file, std::string("key '") + key + "' is not float32 [n]");
    return t;
  };
  const auto index = [&](const char* key) {
    const at::Tensor t = tensor(dict, key, file);
    if (t.dim() != 1 || t.scalar_type() != at::kLong) throw damaged(file, std::string("key '") + key + "' is not int64 [n]");
    const at::Tensor c = t.contiguous();
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  };
  shard_.param = values("param");
  shard_.exp_avg = values("exp_avg");
  shard_.exp_avg_sq = values("exp_avg_sq");
  shard_.offsets = index("offsets");
  shard_.steps = index("steps");
  shard_.groups = with_groups ? index("groups") : std::vector<int64_t>();
  const int64_t n = shard_.param.numel();
  if (shard_.exp_avg.numel() != n || shard_.exp_avg_sq.numel() != n)
    throw damaged(file, "keys 'param', 'exp_avg' and 'exp_avg_sq' differ in length");
}

// Formats 4 to 6: the group's slice of the file its run names (shared with older checkpoints or
// not: checked against this manifest's checksum all the same), the file read and checked once;
// format 6: the group's step count in the file must be the one its run records (a file holds
// the stale values of groups written anew since: a run pointing at the wrong file is refused).
GroupState CheckpointReader::load_linked_group(int group) const {
  const ManifestRun& run = run_of(manifest_, group);
  GroupState st;
  st.group = group;
  if (run.file < 0) {  // initial, or model.init_from's (checked by check_init_sources)
    st.initial = true;
    return st;
  }
  const ManifestFile& f = manifest_.files[static_cast<size_t>(run.file)];
  const std::string where = (fs::path(ckpt_.path) / f.file).string();
  if (shard_.index != run.file) {
    shard_ = {};
    try {  // a damaged file says which group it holds (a file shared by several checkpoints)
      read_shard(load_file(f.file, true, f.fnv1a64), f.file, true);
      check_file_index(f, shard_.param.numel(), shard_.groups, shard_.offsets, shard_.steps, manifest_.num_groups,
                       ckpt_.step, where);
    } catch (const ConfigError& e) {
      shard_ = {};
      throw ConfigError(std::string(e.what()) + "; it holds group " + std::to_string(group) +
                        (run.count > 1 || run.first != group ? " and others" : ""));
    }
    shard_.index = run.file;
  }
  const auto it = std::lower_bound(shard_.groups.begin(), shard_.groups.end(), group);
  if (it == shard_.groups.end() || *it != group)
    throw damaged(f.file, "group " + std::to_string(group) + " is not in it, where manifest.json says it is");
  st = slice(st, static_cast<size_t>(it - shard_.groups.begin()), f.file);
  if (run.steps >= 0 && st.steps != run.steps)
    throw damaged(f.file, "group " + std::to_string(group) + ": step count " + std::to_string(st.steps) +
                              " in the file, " + std::to_string(run.steps) +
                              " in manifest.json's runs (the manifest maps the group to a file that holds other values)");
  return st;
}

// Group `st.group`'s values at position i of the shard read last, checked.
GroupState CheckpointReader::slice(GroupState st, size_t i, const std::string& file) const {
  const int64_t a = shard_.offsets[i], len = shard_.offsets[i + 1] - a;
  st.params = {shard_.param.narrow(0, a, len)};
  // Training on from NaN or Inf would only spread it: refused before any step.
  if (!all_finite(st.params[0]))
    throw ConfigError((fs::path(ckpt_.path) / file).string() + ": group " + std::to_string(st.group) +
                      ": parameters hold NaN or Inf (resume from an earlier checkpoint, or start anew with --no-resume)");
  st.exp_avg = {shard_.exp_avg.narrow(0, a, len)};
  st.exp_avg_sq = {shard_.exp_avg_sq.narrow(0, a, len)};
  st.steps = shard_.steps[i];
  check_state(file, st);
  return st;
}

// Format 3: the group's slice of its shard, the shard read and checked once for all its groups
// (resume goes in group order). Names are not stored: the flat layout is the model's, which the
// manifest's job_hash vouches for; RunState splits it.
GroupState CheckpointReader::load_shard_group(int group) const {
  const size_t s = shard_of(manifest_, group);
  const ManifestShard& sh = manifest_.shards[s];
  if (shard_.index != static_cast<int64_t>(s)) {
    shard_ = {};
    read_shard(load_file(sh.file, true, sh.fnv1a64), sh.file, false);
    check_shard_index(sh, shard_.param.numel(), shard_.offsets, shard_.steps, ckpt_.step,
                      (fs::path(ckpt_.path) / sh.file).string());
    shard_.index = static_cast<int64_t>(s);
  }
  GroupState st;
  st.group = group;
  return slice(st, static_cast<size_t>(group - sh.first), sh.file);
}

// Formats 1 and 2: a file per group, tensors by name.
GroupState CheckpointReader::load_group_file(int group) const {
  const ManifestGroup& mg = manifest_.groups[static_cast<size_t>(group)];
  const c10::impl::GenericDict dict = load_file(mg.file, mg.has_checksum, mg.fnv1a64);
  GroupState st;
  st.group = group;
  for (const auto& item : dict) {
    if (!item.key().isString()) throw damaged(mg.file, "a key that is not a string");
    const std::string key = item.key().toStringRef();
    if (key.rfind("param/", 0) == 0) st.names.push_back(key.substr(6));
  }
  for (const auto& name : st.names) {
    st.params.push_back(tensor(dict, "param/" + name, mg.file));
    if (!all_finite(st.params.back()))
      throw ConfigError((fs::path(ckpt_.path) / mg.file).string() + ": parameter '" + printable(name) +
                        "' holds NaN or Inf (resume from an earlier checkpoint, or start anew with --no-resume)");
    st.exp_avg.push_back(tensor(dict, "exp_avg/" + name, mg.file));
    st.exp_avg_sq.push_back(tensor(dict, "exp_avg_sq/" + name, mg.file));
  }
  const at::Tensor steps = tensor(dict, "steps", mg.file);
  if (steps.numel() != 1 || steps.scalar_type() != at::kLong) throw damaged(mg.file, "key 'steps' is not one int64");
  st.steps = steps.item<int64_t>();
  for (size_t i = 0; i < st.names.size(); ++i)
    if (!st.exp_avg[i].sizes().equals(st.params[i].sizes()) || !st.exp_avg_sq[i].sizes().equals(st.params[i].sizes()))
      throw damaged(mg.file, "the moments of '" + printable(st.names[i]) + "' differ in shape from the parameter");
  check_state(mg.file, st);
  return st;
}

ManifestLayout checkpoint_layout(const config::Job& job, const ParamGroups& groups) {
  LayoutBuilder b(job);
  for (int g = 0; g < groups.num_groups(); ++g)
    for (int p : groups.members[static_cast<size_t>(g)]) {
      const NamedParam& np = groups[p];
      b.add(g, np.name, np.tensor.sizes().vec());
    }
  return b.take();
}

GroupState in_model_layout(const GroupState& loaded, const ParamGroups& groups, int g, const std::string& where) {
  if (loaded.initial) return loaded;  // format 4's initial and model.init_from groups
  if (loaded.names.empty()) {
    const int64_t n = groups.numel(g);
    if (loaded.params.size() == 1 && loaded.params[0].numel() == 0 && n > 0 && loaded.steps == 0) {
      GroupState st;  // format 3's initial group: no values, never updated
      st.group = g;
      st.initial = true;
      return st;
    }
    if (loaded.params.size() != 1 || loaded.params[0].numel() != n)
      throw ConfigError(where + ": group " + std::to_string(g) + " holds " +
                        std::to_string(loaded.params.empty() ? 0 : loaded.params[0].numel()) +
                        " values where this model's group has " + std::to_string(n));
    GroupState st;
    st.group = g;
    st.steps = loaded.steps;
    for (int p : groups.members[static_cast<size_t>(g)]) {
      const NamedParam& np = groups[p];
      const auto off = static_cast<int64_t>(groups.offset[static_cast<size_t>(p)]);
      st.names.push_back(np.name);
      st.params.push_back(loaded.params[0].narrow(0, off, np.tensor.numel()).view(np.tensor.sizes()));
      st.exp_avg.push_back(loaded.exp_avg[0].narrow(0, off, np.tensor.numel()).view(np.tensor.sizes()));
      st.exp_avg_sq.push_back(loaded.exp_avg_sq[0].narrow(0, off, np.tensor.numel()).view(np.tensor.sizes()));
    }
    return st;
  }
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < loaded.names.size(); ++i) by_name[loaded.names[i]] = i;
  GroupState st;
  st.group = g;
  st.steps = loaded.steps;
  for (int p : groups.members[static_cast<size_t>(g)]) {
    const NamedParam& np = groups[p];
    auto it = by_name.find(np.name);
    if (it == by_name.end()) throw ConfigError(where + ": parameter '" + np.name + "' missing");
    if (!loaded.params[it->second].sizes().equals(np.tensor.sizes()))
      throw ConfigError(where + ": parameter '" + np.name + "' has another shape");
    st.names.push_back(np.name);
    st.params.push_back(loaded.params[it->second]);
    st.exp_avg.push_back(loaded.exp_avg[it->second]);
    st.exp_avg_sq.push_back(loaded.exp_avg_sq[it->second]);
  }
  return st;
}

}  // namespace thetad::daemon
