// PEFT adapter directories in and out (see peft_adapters.hpp).
#include "daemon/hf/peft_adapters.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "common/errors.hpp"
#include "common/file_read.hpp"
#include "common/log.hpp"
#include "common/safe_file.hpp"
#include "common/text.hpp"
#include "config/loader.hpp"
#include "config/lora_adapter.hpp"
#include "config/schema.hpp"
#include "daemon/formats/safetensors.hpp"
#include "daemon/hf/export_files.hpp"
#include "daemon/hf/hf_weights.hpp"
#include "daemon/hf/merged_export.hpp"
#include "daemon/plan/peft_config.hpp"

namespace thetad::daemon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kWeights = "adapter_model.safetensors";
constexpr const char* kConfig = "adapter_config.json";

// "lora.T.I.WORD.a" -> PEFT's name of that matrix.
std::string peft_name_of(const std::string& name) {
  const std::optional<config::LoraMatrix> m = config::LoraAdapter::parse(name);
  THETAD_CHECK(m.has_value(), InternalError, "not a LoRA parameter name: ", name);
  return config::LoraAdapter::peft_name(m->layer, m->target, m->a);
}

}  // namespace

void load_peft_adapters(const config::Job& job, TaskModel& model) {
  std::map<std::string, NamedParam*> by_name;
  for (NamedParam& p : model.params()) by_name[p.name] = &p;
  const config::LoraAdapter adapter(job);
  int64_t loaded = 0;
  for (int64_t t = 0; t < job.model.tasks; ++t) {
    const std::string dir = adapter_dir(job.lora.init_from, job, t);
    std::error_code ec;
    if (!fs::exists(dir, ec)) continue;
    check_adapter_config(dir, job);
    const std::string outside = link_outside(dir, kWeights);
    if (!outside.empty()) throw ConfigError(dir + "/" + kWeights + ": lora.init_from: " + outside);
    auto ck = std::make_shared<const SafetensorsCheckpoint>(SafetensorsCheckpoint::open(dir + "/" + kWeights));
    std::set<std::string> used;
    for (const config::LoraMatrix& m : adapter.matrices(t)) {
      const std::string peft = config::LoraAdapter::peft_name(m.layer, m.target, m.a);
      if (!ck->has(peft))
        throw ConfigError(ck->path() + ": lora.init_from: tensor '" + peft + "' is missing (task " + std::to_string(t) + ")");
      assign_from(ck, peft, *by_name.at(config::LoraAdapter::name(m)), "lora.init_from");
      used.insert(peft);
    }
    std::vector<std::string> extra;
    for (const std::string& n : ck->names())
      if (!used.count(n)) extra.push_back(n);
    if (!extra.empty()) {
      THETAD_LOG(warn, "train") << ck->path() << ": lora.init_from: " << extra.size()
                                << " tensors are not adapters of lora.targets and are ignored, the first '"
                                << printable(extra[0]) << "'";
    }
    ++loaded;
  }
  THETAD_LOG(info, "train") << "lora.init_from: adapters of " << loaded << " of " << job.model.tasks << " tasks from "
                            << job.lora.init_from;
}

AdapterExport::AdapterExport(const config::Job& job, const ParamGroups& groups)
    : job_(job), written_at_(static_cast<size_t>(groups.num_groups()), 0), staged_() {
  if (!job.export_.merged_dir.empty()) merged_ = std::make_unique<MergedExport>(job, groups);
  if (job.export_.adapters_dir.empty()) return;
  static const std::set<std::string> kOwn = {kWeights, kConfig, std::string(kWeights) + ".tmp",
                                             std::string(kConfig) + ".tmp", "README.md"};
  std::set<std::string> probed;  // the directories files were created in: each once
  for (int64_t t = 0; t < job.model.tasks; ++t)
    check_export_dir("export.adapters_dir", adapter_dir(job.export_.adapters_dir, job, t), t, "PEFT adapter",
                     [](const std::string& name) { return kOwn.count(name) != 0; }, probed);
}

AdapterExport::~AdapterExport() = default;

std::string AdapterExport::write(int64_t task, const GroupState& st) const {
  const std::string dir = adapter_dir(job_.export_.adapters_dir, job_, task);
  // Made private where missing (0700); one that exists must be this user's own directory.
  if (const std::string why = safe_file::make_dirs(dir, true); !why.empty())
    throw Error(dir + ": export.adapters_dir: cannot write there: " + why);
  std::vector<ExportTensor> held;  // export.dtype's copies, alive until written
  std::vector<StWriteTensor> tensors;
  for (size_t k = 0; k < st.names.size(); ++k) {
    held.push_back(export_tensor(st.params[k], job_.export_.dtype,
                                 "export.adapters_dir: task " + std::to_string(task) + "'s adapter: parameter '" +
                                     st.names[k] + "'"));
    const torch::Tensor& t = held.back().data;
    tensors.push_back({peft_name_of(st.names[k]), held.back().dtype, t.sizes().vec(), t.data_ptr(),
                       static_cast<size_t>(t.nbytes())});
  }
  write_safetensors_file(dir + "/" + kWeights + ".tmp", tensors, {{"format", "pt"}}, /*sync=*/false);
  std::vector<std::string> modules;
  const config::LoraAdapter adapter(job_);
  for (config::LoraTarget t : adapter.targets()) modules.push_back(peft_module_word(t));
  const json config = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"r", job_.lora.rank},
      {"lora_alpha", job_.lora.alpha},
      {"lora_dropout", 0.0},
      {"target_modules", modules},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"modules_to_save", nullptr},
      {"base_model_name_or_path", job_.export_.base_model.empty() ? job_.model.init_from : job_.export_.base_model},
      {"revision", nullptr},
  };
  write_text(dir + "/" + kConfig + ".tmp", config.dump(2) + "\n");
  return dir;
}

int AdapterExport::stage_changed(int rank, int world, const std::vector<int64_t>& group_steps,
                                 const std::function<GroupState(int)>& state, bool all, bool last) {
  // The merged models (export.merged_dir) at the run's end only: each is a copy of the base.
  if (merged_ && last) {
    try {
      merged_->stage(rank, world, state, staged_);
    } catch (...) {
      discard_staged();
      throw;
    }
  }
  if (job_.export_.adapters_dir.empty()) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int> due;
  for (int64_t t = rank; t < job_.model.tasks; t += world) {
    const auto g = static_cast<size_t>(t + 1);
    if (group_steps[g] != 0 && (all || group_steps[g] != written_at_[g])) due.push_back(static_cast<int>(g));
  }
  // Read on this thread (where the groups live), checked, written in parallel a batch at a time
  // so that the copies held stay small whatever the number of tasks; put in place together by
  // publish_staged once every rank staged its share.
  constexpr size_t kBatch = 64;
  std::vector<std::string> dirs(due.size());
  try {
    for (size_t first = 0; first < due.size(); first += kBatch) {
      std::vector<GroupState> batch;
      for (size_t i = first; i < std::min(due.size(), first + kBatch); ++i) {
        GroupState st = state(due[i]);
        // To the host here, on the trainer's stream: ordered after the step's device work, as a
        // checkpoint's copies are.
        for (torch::Tensor& t : st.params) t = t.to(torch::kCPU, torch::kFloat32).contiguous();
        // An adapter of NaN or Inf would load into PEFT and compute NaN: refused as a
        // checkpoint's parameters are, before any of this export is written.
        for (size_t k = 0; k < st.params.size(); ++k) {
          const float* v = st.params[k].data_ptr<float>();
          if (!std::all_of(v, v + st.params[k].numel(), [](float x) { return std::isfinite(x); }))
            throw Error("export.adapters_dir: task " + std::to_string(due[i] - 1) + "'s adapter: parameter '" +
                        st.names[k] + "' holds NaN or Inf; no adapter of this export is written (the training "
                        "diverged: see train.on_nonfinite)");
        }
        st.exp_avg.clear();
        st.exp_avg_sq.clear();
        batch.push_back(std::move(st));
      }
      at::parallel_for(0, static_cast<int64_t>(batch.size()), 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const GroupState& st = batch[static_cast<size_t>(i)];
          if (!st.initial) dirs[first + static_cast<size_t>(i)] = write(st.group - 1, st);
        }
      });
    }
  } catch (...) {
    stage(dirs);  // those written before one failed: removed with the rest
    discard_staged();
    throw;
  }
  stage(dirs);
  for (int g : due) staged_steps_.emplace_back(g, group_steps[static_cast<size_t>(g)]);
  if (!due.empty()) {
    THETAD_LOG(info, "train") << "export.adapters_dir: " << due.size() << " adapters written in " << std::fixed
                              << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s";
  }
  return static_cast<int>(due.size());
}

void AdapterExport::stage(const std::vector<std::string>& dirs) {
  for (const std::string& dir : dirs)
    if (!dir.empty())
      for (const char* name : {kWeights, kConfig}) staged_.add(dir + "/" + name, "export.adapters_dir");
}

void AdapterExport::publish_staged() {
  staged_.publish();
  if (merged_) merged_->published();
  for (const auto& [g, steps] : staged_steps_) written_at_[static_cast<size_t>(g)] = steps;
  staged_steps_.clear();
}

void AdapterExport::discard_staged() noexcept {
  staged_.discard();
  staged_steps_.clear();
}

}  // namespace thetad::daemon
