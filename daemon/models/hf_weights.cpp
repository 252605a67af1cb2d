// load_safetensors_weights (see hf_weights.hpp).
#include "daemon/models/hf_weights.hpp"

#include <ATen/Parallel.h>

#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "daemon/core/hf_names.hpp"
#include "daemon/core/safetensors.hpp"

namespace thetad::daemon {

bool is_safetensors_source(const std::string& path) {
  const std::string ext = ".safetensors";
  std::error_code ec;
  return std::filesystem::is_directory(path, ec) ||
         (path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0);
}

namespace {

void check(const SafetensorsCheckpoint& ck, const std::string& name, const NamedParam& p, const std::string& what) {
  const StTensor& t = ck.tensor(name);
  if (t.shape != p.tensor.sizes().vec())
    throw ConfigError(ck.file_of(name) + ": " + what + ": tensor '" + name + "' has shape " + st_shape_string(t.shape) +
                      ", the model's " + p.name + " has " + st_shape_string(p.tensor.sizes().vec()));
  if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16")
    throw ConfigError(ck.file_of(name) + ": " + what + ": tensor '" + name + "' is " + t.dtype + ", not F32, BF16 or F16");
}

}  // namespace

void assign_from(const std::shared_ptr<const SafetensorsCheckpoint>& ck, const std::string& name, NamedParam& p,
                 const std::string& what) {
  check(*ck, name, p, what);
  if (p.init) {  // a placeholder the host store fills later, from the map
    p.init = [ck, name](torch::Tensor& dst) { ck->read_fp32(name, dst.sizes().vec(), dst.data_ptr<float>()); };
    return;
  }
  torch::NoGradGuard no_grad;
  const bool direct = p.tensor.is_cpu() && p.tensor.is_contiguous() && p.tensor.scalar_type() == torch::kFloat32;
  torch::Tensor dst = direct ? p.tensor : torch::empty(p.tensor.sizes(), torch::kFloat32);
  ck->read_fp32(name, dst.sizes().vec(), dst.data_ptr<float>());
  if (!direct) p.tensor.copy_(dst);
}

void load_safetensors_weights(const config::Job& job, TaskModel& model) {
  const std::string& path = job.model.init_from;
  auto ck = std::make_shared<const SafetensorsCheckpoint>(SafetensorsCheckpoint::open(path));
  std::map<std::string, NamedParam*> by_name;
  for (NamedParam& p : model.params()) by_name[p.name] = &p;
  // Parameter -> the file's tensor that holds it.
  std::map<NamedParam*, std::string> source;
  std::vector<std::string> extra;
  for (const std::string& name : ck->names()) {
    auto it = by_name.find(name);
    if (it == by_name.end()) it = by_name.find(thetad_name_of_hf(name));
    if (it == by_name.end()) {
      extra.push_back(name);
      continue;
    }
    const auto [prev, fresh] = source.emplace(it->second, name);
    if (!fresh)
      throw ConfigError(ck->file_of(name) + ": model.init_from: tensors '" + prev->second + "' and '" + name +
                        "' both hold parameter '" + it->first + "'");
  }
  std::vector<std::pair<NamedParam*, std::string>> now;
  for (NamedParam& p : model.params()) {
    const auto it = source.find(&p);
    if (it != source.end()) {
      now.emplace_back(&p, it->second);
    } else if (p.group == 0) {
      const std::string hf = hf_name_of_thetad(p.name);
      throw ConfigError(path + ": model.init_from: tensor '" + (hf.empty() ? p.name : hf) + "' is missing (thetad's " +
                        p.name + ", shape " + st_shape_string(p.tensor.sizes().vec()) + ")");
    }
  }
  // Shapes and dtypes first (one pass, nothing written), then converted in parallel over
  // parameters (each a pass over its mapped bytes).
  for (auto& [p, name] : now) check(*ck, name, *p, "model.init_from");
  at::parallel_for(0, static_cast<int64_t>(now.size()), 1, [&](int64_t b, int64_t e) {
    torch::NoGradGuard no_grad;
    for (int64_t i = b; i < e; ++i) assign_from(ck, now[static_cast<size_t>(i)].second, *now[static_cast<size_t>(i)].first, "model.init_from");
  });
  if (!extra.empty()) {
    std::string list;
    for (size_t i = 0; i < extra.size() && i < 8; ++i) list += (i ? ", " : "") + extra[i];
    THETAD_LOG(warn, "train") << path << ": model.init_from: " << extra.size()
                              << " tensors name no parameter of the model and are ignored: " << list
                              << (extra.size() > 8 ? ", ..." : "");
  }
  THETAD_LOG(info, "train") << "model.init_from: " << source.size() << " parameters from " << path;
}

}  // namespace thetad::daemon
