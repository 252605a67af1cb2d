// check_adapter_config and check_adapter_inputs (see peft_config.hpp).
#include "daemon/plan/peft_config.hpp"

#include <filesystem>
#include <set>

#include "common/errors.hpp"
#include "common/file_read.hpp"
#include "common/json_read.hpp"
#include "common/text.hpp"
#include "config/placeholders.hpp"
#include "config/schema.hpp"
#include "config/lora_adapter.hpp"

namespace thetad::daemon {

using nlohmann::json;

std::string peft_module_word(config::LoraTarget target) {
  const std::string m = config::peft_module_of(target);
  return m.substr(m.find('.') + 1);
}

void check_adapter_config(const std::string& dir, const config::Job& job) {
  const std::string file = dir + "/adapter_config.json";
  const auto bad = [&](const std::string& what) { throw ConfigError(file + ": lora.init_from: " + what); };
  const std::string outside = link_outside(dir, "adapter_config.json");
  if (!outside.empty()) bad(outside);
  std::string text;
  const ReadResult read = read_regular_file(file, kMaxJsonFileBytes, text);
  if (!read)
    bad((read.failure == ReadFailure::io ? "cannot read (a PEFT adapter directory has one): " : "") + read.why);
  JsonProblem problem;
  const json c = parse_json(text.data(), text.data() + text.size(), problem);
  if (problem != JsonProblem::none) bad(json_problem_text(problem));
  if (!c.is_object()) bad("not a JSON object");
  const auto get = [&](const char* key) { return c.contains(key) ? c[key] : json(); };
  if (get("peft_type") != "LORA") bad("peft_type is " + json_brief(get("peft_type")) + ", not \"LORA\"");
  if (!get("r").is_number_integer() || get("r").get<int64_t>() != job.lora.rank)
    bad("r = " + json_brief(get("r")) + " but lora.rank is " + std::to_string(job.lora.rank));
  if (!get("lora_alpha").is_number() || get("lora_alpha").get<double>() != job.lora.alpha)
    bad("lora_alpha = " + json_brief(get("lora_alpha")) + " but lora.alpha is " +
        config::detail::format_double(job.lora.alpha));
  std::set<std::string> want, have;
  const config::LoraAdapter adapter(job);
  for (config::LoraTarget t : adapter.targets()) want.insert(peft_module_word(t));
  bool strings = get("target_modules").is_array();
  if (strings)
    for (const json& m : get("target_modules")) {
      strings = strings && m.is_string();
      if (m.is_string()) have.insert(m.get<std::string>());
    }
  if (!strings || want != have) {
    std::string listed, wanted;
    for (const std::string& m : have) listed += (listed.empty() ? "" : ", ") + printable(m.substr(0, 40));
    for (const std::string& m : want) wanted += (wanted.empty() ? "" : ", ") + m;
    bad("target_modules = " + (strings ? "[" + listed + "]" : json_brief(get("target_modules"))) +
        " but lora.targets gives [" + wanted + "]");
  }
  for (const char* key : {"use_rslora", "use_dora", "fan_in_fan_out"})
    if (get(key).is_boolean() && get(key).get<bool>()) bad(std::string(key) + " is true; thetad's LoRA has no such form");
  if (!get("bias").is_null() && get("bias") != "none") bad("bias = " + json_brief(get("bias")) + "; thetad's adapters have none");
  for (const char* key : {"layers_to_transform", "modules_to_save"})
    if (!get(key).is_null()) bad(std::string(key) + " = " + json_brief(get(key)) + " is not supported");
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    if (!get(key).is_null() && !get(key).empty()) bad(std::string(key) + " = " + json_brief(get(key)) + " is not supported");
}

}  // namespace thetad::daemon

namespace thetad::daemon {

void check_adapter_inputs(const config::Job& job) {
  if (job.model.kind != config::ModelKind::Transformer || job.lora.init_from.empty()) return;
  const bool per_task = job.lora.init_from.find("{task}") != std::string::npos;
  for (int64_t t = 0; t < (per_task ? job.model.tasks : 1); ++t) {
    config::PathValues v;
    v.job = job.name;
    v.rank = 0;
    v.task = t;
    const std::string dir = config::expand_placeholders(job.lora.init_from, v);
    std::error_code ec;
    if (!std::filesystem::exists(dir, ec)) continue;  // that task starts afresh
    check_adapter_config(dir, job);
    const std::string weights = dir + "/adapter_model.safetensors";
    const std::string outside = link_outside(dir, "adapter_model.safetensors");
    if (!outside.empty()) throw ConfigError(weights + ": lora.init_from: " + outside);
    // A regular file (its tensors are checked as the run maps and reads them).
    std::error_code st_ec;
    if (!std::filesystem::is_regular_file(weights, st_ec))
      throw ConfigError(weights + ": lora.init_from: " +
                        (std::filesystem::exists(weights, st_ec) ? "not a regular file" : "missing (a PEFT adapter directory has one)"));
  }
}

}  // namespace thetad::daemon
