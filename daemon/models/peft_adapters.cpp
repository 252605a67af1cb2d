// PEFT adapter directories in and out (see peft_adapters.hpp).
#include "daemon/models/peft_adapters.hpp"

#include <ATen/Parallel.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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
#include "config/placeholders.hpp"
#include "config/schema.hpp"
#include "daemon/core/hf_names.hpp"
#include "daemon/core/peft_config.hpp"
#include "daemon/core/safetensors.hpp"
#include "daemon/models/hf_weights.hpp"

namespace thetad::daemon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kWeights = "adapter_model.safetensors";
constexpr const char* kConfig = "adapter_config.json";

// "lora.T.I.WORD.a" -> PEFT's name of that matrix.
std::string peft_name_of(const std::string& name) {
  std::vector<std::string> parts(1);
  for (char c : name) {
    if (c == '.') parts.emplace_back();
    else parts.back() += c;
  }
  THETAD_CHECK(parts.size() == 5 && parts[0] == "lora", InternalError, "not a LoRA parameter name: ", name);
  return peft_lora_name(std::stol(parts[2]), parts[3], parts[4] == "a");
}

// `text` at `path` (not synced: publish makes it durable), created anew (a leftover or planted
// name replaced, never followed: safe_file.hpp); a failure removes it.
void write_text(const std::string& path, const std::string& text) {
  const int fd = safe_file::create_fresh(path);
  if (fd < 0) throw Error(path + ": cannot create: " + std::strerror(errno));
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int e = errno;
  if (::close(fd) != 0 || !ok) {
    ::unlink(path.c_str());
    throw Error(path + ": cannot write: " + std::strerror(ok ? errno : e));
  }
}

// syncfs on the filesystem of each directory (one call per filesystem).
void sync_filesystems(const std::vector<std::string>& dirs) {
  std::set<dev_t> done;
  for (const std::string& dir : dirs) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !done.insert(st.st_dev).second) continue;
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const bool ok = fd >= 0 && ::syncfs(fd) == 0;
    const int e = errno;
    if (fd >= 0) ::close(fd);
    if (!ok) throw Error(dir + ": export.adapters_dir: syncfs: " + std::strerror(e));
  }
}

// Makes the adapters written under temporary names durable and puts them in place: their data
// synced (one syncfs per filesystem), then the renames, then synced again (the renames). Two
// syncs for any number of adapters, where a fsync per file made 10,000 adapters 20,000 journal
// commits; a crash leaves every adapter's files whole, old or new (as fsync and rename per file).
void publish(const std::vector<std::string>& dirs) {
  sync_filesystems(dirs);
  for (const std::string& dir : dirs)
    for (const char* name : {kWeights, kConfig}) {
      const std::string path = dir + "/" + name;
      if (std::rename((path + ".tmp").c_str(), path.c_str()) != 0)
        throw Error(path + ": export.adapters_dir: cannot rename " + path + ".tmp into place: " + std::strerror(errno));
    }
  sync_filesystems(dirs);
}

}  // namespace

std::string adapter_dir(const std::string& pattern, const config::Job& job, int64_t task) {
  config::PathValues values;
  values.job = job.name;
  values.rank = 0;  // every rank reads and writes the same directories
  values.task = task;
  return config::expand_placeholders(pattern, values);
}

void load_peft_adapters(const config::Job& job, TaskModel& model) {
  std::map<std::string, NamedParam*> by_name;
  for (NamedParam& p : model.params()) by_name[p.name] = &p;
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
    for (int64_t i = 0; i < job.model.layers; ++i)
      for (const std::string& word : job.lora.targets)
        for (const bool a : {true, false}) {
          const std::string peft = peft_lora_name(i, word, a);
          const std::string ours = "lora." + std::to_string(t) + "." + std::to_string(i) + "." + word + (a ? ".a" : ".b");
          if (!ck->has(peft))
            throw ConfigError(ck->path() + ": lora.init_from: tensor '" + peft + "' is missing (task " + std::to_string(t) + ")");
          assign_from(ck, peft, *by_name.at(ours), "lora.init_from");
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
    : job_(job), written_at_(static_cast<size_t>(groups.num_groups()), 0) {
  static const std::set<std::string> kOwn = {kWeights, kConfig, std::string(kWeights) + ".tmp",
                                             std::string(kConfig) + ".tmp", "README.md"};
  std::set<std::string> probed;  // the directories files were created in: each once
  for (int64_t t = 0; t < job.model.tasks; ++t) {
    const std::string dir = adapter_dir(job.export_.adapters_dir, job, t);
    const std::string before = " (found before any step; refusing to write task " + std::to_string(t) + "'s adapter there)";
    std::error_code ec;
    std::string at = dir;  // where its files (or its directory) would be created
    while (!fs::exists(fs::symlink_status(at, ec)) && fs::path(at).has_parent_path() && fs::path(at).parent_path() != at)
      at = fs::path(at).parent_path().string();
    if (at == dir && fs::exists(fs::symlink_status(dir, ec))) {
      if (!fs::is_directory(dir, ec))
        throw ConfigError(dir + ": export.adapters_dir: exists and is not a directory; refusing to write task " +
                          std::to_string(t) + "'s adapter there");
      if (const std::string why = safe_file::make_dirs(dir, true); !why.empty())
        throw ConfigError(dir + ": export.adapters_dir: " + why + before);
      for (const auto& entry : fs::directory_iterator(dir, ec))
        if (!kOwn.count(entry.path().filename().string()))
          throw ConfigError(dir + ": export.adapters_dir: holds '" + entry.path().filename().string() +
                            "', which is not a PEFT adapter's file; refusing to write task " + std::to_string(t) +
                            "'s adapter there (choose an empty or new directory)");
    }
    if (!probed.insert(at).second) continue;
    if (const std::string why = safe_file::probe_writable(at); !why.empty())
      throw ConfigError(dir + ": export.adapters_dir: not writable: " + why + before);
  }
}

std::string AdapterExport::write(int64_t task, const GroupState& st) const {
  const std::string dir = adapter_dir(job_.export_.adapters_dir, job_, task);
  // Made private where missing (0700); one that exists must be this user's own directory.
  if (const std::string why = safe_file::make_dirs(dir, true); !why.empty())
    throw Error(dir + ": export.adapters_dir: cannot write there: " + why);
  std::vector<StWriteTensor> tensors;
  for (size_t k = 0; k < st.names.size(); ++k) {
    const torch::Tensor& t = st.params[k];  // contiguous float32 on the host (write_changed)
    tensors.push_back({peft_name_of(st.names[k]), "F32", t.sizes().vec(), t.data_ptr(),
                       static_cast<size_t>(t.numel()) * sizeof(float)});
  }
  write_safetensors_file(dir + "/" + kWeights + ".tmp", tensors, {{"format", "pt"}}, /*sync=*/false);
  std::vector<std::string> modules;
  for (const std::string& t : job_.lora.targets) modules.push_back(peft_module_word(t));
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
                                 const std::function<GroupState(int)>& state, bool all) {
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
      for (size_t i = first; i < std::min(due.size(), first + kBatch); ++i)
        if (!dirs[i].empty()) staged_.push_back(dirs[i]);
    }
  } catch (...) {
    for (const std::string& dir : dirs)
      if (!dir.empty()) staged_.push_back(dir);  // a batch's written before one of it failed
    discard_staged();
    throw;
  }
  for (int g : due) staged_steps_.emplace_back(g, group_steps[static_cast<size_t>(g)]);
  if (!due.empty()) {
    THETAD_LOG(info, "train") << "export.adapters_dir: " << due.size() << " adapters written in " << std::fixed
                              << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s";
  }
  return static_cast<int>(due.size());
}

void AdapterExport::publish_staged() {
  publish(staged_);
  staged_.clear();
  for (const auto& [g, steps] : staged_steps_) written_at_[static_cast<size_t>(g)] = steps;
  staged_steps_.clear();
}

void AdapterExport::discard_staged() noexcept {
  for (const std::string& dir : staged_)
    for (const char* name : {kWeights, kConfig}) (void)::unlink((dir + "/" + name + ".tmp").c_str());
  staged_.clear();
  staged_steps_.clear();
}

}  // namespace thetad::daemon
