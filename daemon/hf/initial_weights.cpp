// load_initial_weights (see daemon/models/initial_weights.hpp).
#include "daemon/models/initial_weights.hpp"

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "daemon/formats/safetensors.hpp"
#include "daemon/hf/hf_weights.hpp"
#include "daemon/hf/peft_adapters.hpp"
#include "daemon/hf/pt_dict.hpp"

namespace thetad::daemon {
namespace {

std::string shape_of(const torch::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

// name -> tensor from the file; thetad checkpoint files: "param/NAME" keys, the rest skipped.
std::map<std::string, torch::Tensor> read_state_dict(const std::string& path) {
  const c10::impl::GenericDict dict = load_pt_dict(path, "model.init_from");
  bool checkpoint = false;
  for (const auto& item : dict)
    if (item.key().isString() && item.key().toStringRef().rfind("param/", 0) == 0) checkpoint = true;
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : dict) {
    if (!item.key().isString()) throw ConfigError(path + ": model.init_from: a key that is not a string");
    std::string key = item.key().toStringRef();
    if (checkpoint) {
      if (key.rfind("param/", 0) != 0) continue;  // exp_avg/..., steps: the optimizer's
      key = key.substr(6);
    }
    if (!item.value().isTensor())
      throw ConfigError(path + ": model.init_from: key '" + printable(key) + "' is not a tensor");
    out[key] = item.value().toTensor();
  }
  return out;
}

// `value` as float32, contiguous; a NaN or an infinity is refused naming the file and the key
// (training from it would fail at the first step, blaming the learning rate).
torch::Tensor finite_fp32(const torch::Tensor& value, const std::string& path, const std::string& key) {
  const torch::Tensor v = value.to(torch::kFloat32).contiguous();
  const int64_t bad = st_first_nonfinite("F32", v.data_ptr(), static_cast<size_t>(v.numel()));
  if (bad >= 0)
    throw ConfigError(path + ": model.init_from: tensor '" + printable(key) + "' " +
                      st_nonfinite_text("F32", v.data_ptr(), bad) + " (thetad trains only from finite values)");
  return v;
}

// A state dict of torch.save or a checkpoint group file.
void load_pickled_weights(const config::Job& job, TaskModel& model) {
  const std::string& path = job.model.init_from;
  std::map<std::string, torch::Tensor> values = read_state_dict(path);
  std::map<std::string, NamedParam*> by_name;
  for (NamedParam& p : model.params()) by_name[p.name] = &p;
  for (const auto& [name, t] : values) {
    auto it = by_name.find(name);
    if (it == by_name.end())
      throw ConfigError(path + ": model.init_from: key '" + printable(name) + "' is not a parameter of the model (" +
                        config::to_string(job.model.kind) + "; its first is '" + model.params().front().name + "')");
    const NamedParam& p = *it->second;
    if (!p.tensor.sizes().equals(t.sizes()))
      throw ConfigError(path + ": model.init_from: key '" + printable(name) + "' has shape " + shape_of(t) +
                        ", the model's parameter has " + shape_of(p.tensor));
  }
  int loaded = 0;
  for (NamedParam& p : model.params()) {
    auto it = values.find(p.name);
    if (it == values.end()) {
      if (p.group == 0)
        throw ConfigError(path + ": model.init_from: shared parameter '" + p.name + "' is missing from the file");
      continue;
    }
    const torch::Tensor value = finite_fp32(it->second, path, p.name);
    if (p.init) {  // a placeholder the host store fills later
      p.init = [value](torch::Tensor& dst) { dst.copy_(value); };
    } else {
      torch::NoGradGuard no_grad;
      p.tensor.copy_(value);
    }
    ++loaded;
  }
  THETAD_LOG(info, "train") << "model.init_from: " << loaded << " parameters from " << path;
}

}  // namespace

void load_initial_weights(const config::Job& job, TaskModel& model) {
  const std::string& path = job.model.init_from;
  if (!path.empty() && is_safetensors_source(path)) load_safetensors_weights(job, model);
  else if (!path.empty()) load_pickled_weights(job, model);
  if (!job.lora.init_from.empty()) load_peft_adapters(job, model);  // over any task values of the base's file
}

}  // namespace thetad::daemon
