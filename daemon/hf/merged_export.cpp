// Merged model directories (see merged_export.hpp).
#include "daemon/hf/merged_export.hpp"

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/safe_file.hpp"
#include "config/hf_config.hpp"
#include "config/lora_adapter.hpp"
#include "daemon/formats/hf_names.hpp"
#include "daemon/formats/safetensors.hpp"
#include "daemon/ops/precision.hpp"

namespace thetad::daemon {
namespace {

namespace fs = std::filesystem;
constexpr const char* kKey = "export.merged_dir";
constexpr const char* kIndex = "model.safetensors.index.json";

// The base directory's files a merged model directory carries over as they are: what tokenizes
// its text and how it generates, so that the directory serves as the base's did.
constexpr const char* kCopied[] = {"generation_config.json", "tokenizer.json",  "tokenizer_config.json",
                                   "special_tokens_map.json", "tokenizer.model", "vocab.json",
                                   "merges.txt",              "added_tokens.json", "chat_template.jinja"};

// model.safetensors, its index, or a shard "model-00001-of-00003.safetensors".
bool weight_file(const std::string& name) {
  if (name == "model.safetensors" || name == kIndex) return true;
  const std::string form = "model-#####-of-#####.safetensors";
  if (name.size() != form.size()) return false;
  for (size_t i = 0; i < form.size(); ++i)
    if (form[i] == '#' ? !std::isdigit(static_cast<unsigned char>(name[i])) : name[i] != form[i]) return false;
  return true;
}

// A name a merged model directory may hold (before this export writes it): its own files and
// their temporary names.
bool own_file(std::string name) {
  if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) name.resize(name.size() - 4);
  if (weight_file(name) || name == "config.json" || name == "README.md") return true;
  for (const char* c : kCopied)
    if (name == c) return true;
  return false;
}

std::string shard_name(size_t k, size_t n) {
  if (n == 1) return "model.safetensors";
  char buf[48];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k + 1, n);
  return buf;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) throw Error(path + ": " + kKey + ": cannot read");
  return text;
}

// config.json of the base with the dtype of the weights written (transformers 4 reads
// torch_dtype, 5 dtype), its other keys in their order.
std::string merged_config(const std::string& file, config::ExportDtype dtype) {
  static const char* const kNames[] = {"float32", "bfloat16", "float16"};
  nlohmann::ordered_json c = nlohmann::ordered_json::parse(read_file(file), nullptr, false);
  if (c.is_discarded() || !c.is_object()) throw Error(file + ": " + kKey + ": not a JSON object");
  const char* word = kNames[static_cast<size_t>(dtype)];
  c["torch_dtype"] = word;
  if (c.contains("dtype")) c["dtype"] = word;
  return c.dump(2) + "\n";
}

// A layer's adapted matrix: (layer, target).
using MatrixKey = std::pair<int64_t, config::LoraTarget>;

// The adapter's (A, B) by the matrix they adapt, from its group's matrices (config::LoraAdapter).
std::map<MatrixKey, std::pair<torch::Tensor, torch::Tensor>> adapters_of(const GroupState& st) {
  std::map<MatrixKey, std::pair<torch::Tensor, torch::Tensor>> out;
  for (size_t k = 0; k < st.names.size(); ++k) {
    const std::optional<config::LoraMatrix> m = config::LoraAdapter::parse(st.names[k]);
    THETAD_CHECK(m.has_value(), InternalError, "export.merged_dir: '", st.names[k], "' is no adapter matrix");
    auto& ab = out[{m->layer, m->target}];
    (m->a ? ab.first : ab.second) = st.params[k].to(torch::kCPU, torch::kFloat32);
  }
  return out;
}

// "blocks.3.attn.q.weight" -> (3, q), the matrix an adapter of that target adapts; nullopt for a
// parameter that is no adaptable matrix.
std::optional<MatrixKey> adapted_matrix(const std::string& name) {
  const std::string prefix = "blocks.", suffix = ".weight";
  if (name.compare(0, prefix.size(), prefix) != 0 || name.size() < prefix.size() + suffix.size() ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  const std::string rest = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());  // "3.attn.q"
  const size_t dot = rest.find('.'), module = rest.find('.', dot + 1);
  if (dot == std::string::npos || module == std::string::npos) return std::nullopt;
  const std::optional<config::LoraTarget> target = config::lora_target_of(rest.substr(module + 1));
  if (!target || dot == 0 || rest.find_first_not_of("0123456789") != dot) return std::nullopt;
  return MatrixKey{std::stoll(rest.substr(0, dot)), *target};
}

}  // namespace

MergedExport::MergedExport(const config::Job& job, const ParamGroups& groups) : job_(job), groups_(groups) {
  std::set<std::string> probed;
  std::vector<int64_t> tasks = job.export_.merged_tasks;
  if (tasks.empty()) tasks.push_back(0);
  for (int64_t t : tasks)
    check_export_dir(kKey, adapter_dir(job.export_.merged_dir, job, t), t, "merged model", own_file, probed);
}

void MergedExport::stage(int rank, int world, const std::function<GroupState(int)>& state, StagedFiles& staged) {
  std::vector<int64_t> tasks = job_.export_.merged_tasks;
  if (tasks.empty()) tasks.push_back(0);
  for (int64_t t : tasks) {
    if (t % world != rank) continue;
    const std::string dir = adapter_dir(job_.export_.merged_dir, job_, t);
    // Made private where missing (0700); one that exists must be this user's own directory.
    if (const std::string why = safe_file::make_dirs(dir, true); !why.empty())
      throw Error(dir + ": " + kKey + ": cannot write there: " + why);
    write(t, dir, state(static_cast<int>(t) + 1), staged);
  }
}

void MergedExport::write(int64_t task, const std::string& dir, const GroupState& adapters, StagedFiles& staged) {
  const auto t0 = std::chrono::steady_clock::now();
  torch::NoGradGuard no_grad;  // values out, no graph: the parameters may require gradients
  const config::ExportDtype dtype = job_.export_.dtype;
  const size_t item = dtype == config::ExportDtype::Fp32 ? 4 : 2;
  // A task never trained (and not held: initial) has its initial adapters, B = 0: the base.
  const auto ab = adapters.initial ? decltype(adapters_of(adapters))() : adapters_of(adapters);
  const double scale = config::LoraAdapter(job_).scale();
  // Θ's parameters in registration order, cut into shards of at most max_shard_mb (a larger
  // tensor alone), as transformers' save_pretrained cuts them.
  const auto& base = groups_.members.at(0);
  const size_t max_bytes = config::mib_to_bytes(job_.export_.max_shard_mb);
  std::vector<std::vector<int>> shards(1);
  size_t filled = 0, total = 0;
  for (int p : base) {
    const size_t bytes = static_cast<size_t>(groups_[p].tensor.numel()) * item;
    if (!shards.back().empty() && filled + bytes > max_bytes) {
      shards.emplace_back();
      filled = 0;
    }
    shards.back().push_back(p);
    filled += bytes;
    total += bytes;
  }
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  std::set<std::string> files;
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string file = shard_name(k, shards.size());
    std::vector<ExportTensor> held;  // alive until the shard is written
    std::vector<StWriteTensor> tensors;
    held.reserve(shards[k].size());
    for (int p : shards[k]) {
      const NamedParam& param = groups_[p];
      const std::string hf = hf_name_of_thetad(param.name);
      THETAD_CHECK(!hf.empty(), InternalError, "export.merged_dir: parameter ", param.name, " has no Hugging Face name");
      // On the host, where the adapters are: a GPU run keeps an fp32 base on the device.
      torch::Tensor w = fp32_values(param.tensor).to(torch::kCPU);
      const std::optional<MatrixKey> adapted = adapted_matrix(param.name);
      const auto it = adapted ? ab.find(*adapted) : ab.end();
      if (it != ab.end()) w = w + it->second.second.matmul(it->second.first) * scale;  // W + (alpha / r) B A
      held.push_back(export_tensor(w, dtype, std::string(kKey) + ": task " + std::to_string(task) +
                                                 "'s merged model: tensor '" + hf + "'"));
      const torch::Tensor& t = held.back().data;
      tensors.push_back({hf, held.back().dtype, t.sizes().vec(), t.data_ptr(), static_cast<size_t>(t.nbytes())});
      weight_map[hf] = file;
    }
    write_safetensors_file(dir + "/" + file + ".tmp", tensors, {{"format", "pt"}}, /*sync=*/false);
    staged.add(dir + "/" + file, kKey);
    files.insert(file);
  }
  if (shards.size() > 1) {
    const nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_text(dir + "/" + kIndex + ".tmp", index.dump(2) + "\n");
    staged.add(dir + "/" + kIndex, kKey);
    files.insert(kIndex);
  }
  const std::string config_file = config::hf_config_file(job_.model.init_from);
  write_text(dir + "/config.json.tmp", merged_config(config_file, dtype));
  staged.add(dir + "/config.json", kKey);
  const fs::path from = fs::path(config_file).parent_path();
  std::error_code ec;
  for (const char* name : kCopied) {
    if (!fs::is_regular_file(from / name, ec)) continue;
    write_text(dir + "/" + name + ".tmp", read_file((from / name).string()));
    staged.add(dir + "/" + name, kKey);
  }
  written_.emplace_back(dir, std::move(files));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  THETAD_LOG(info, "train") << kKey << ": task " << task << "'s merged model (" << shards.size() << " safetensors file"
                            << (shards.size() == 1 ? "" : "s") << ", " << std::fixed << std::setprecision(3)
                            << double(total) / 1e9 << " GB) written to " << dir << " in " << std::setprecision(2) << s
                            << " s";
}

void MergedExport::published() noexcept {
  for (const auto& [dir, files] : written_) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (weight_file(name) && !files.count(name)) (void)::unlink(entry.path().c_str());
    }
  }
  written_.clear();
}

}  // namespace thetad::daemon
