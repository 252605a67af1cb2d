// The best adapters kept across runs (see best_adapters.hpp).
#include "daemon/train/best_adapters.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include "common/errors.hpp"
#include "common/safe_file.hpp"
#include "config/loader.hpp"
#include "daemon/formats/safetensors.hpp"

namespace thetad::daemon {
namespace {

namespace fs = std::filesystem;

constexpr const char* kBestDir = "best-eval";

// A metadata value as the record wrote it; ConfigError naming the file where it is missing.
std::string best_meta(const SafetensorsFile& f, const char* key) {
  const auto it = f.header().metadata.find(key);
  if (it == f.header().metadata.end())
    throw ConfigError(f.path() + ": export.best: no '" + key + "' in its metadata: not a best-adapter record of thetad's");
  return it->second;
}

}  // namespace

BestAdapters::BestAdapters(const config::Job& job) {
  if (!job.checkpoint.dir.empty()) dir_ = config::checkpoint_dir(job) + "/" + kBestDir;
}

std::string BestAdapters::file(int task) const { return dir_ + "/task" + std::to_string(task) + ".safetensors"; }

std::optional<BestAdapter> BestAdapters::load(int task, const ParamGroups& groups, int64_t upto) const {
  std::error_code ec;
  if (dir_.empty() || !fs::exists(file(task), ec)) return std::nullopt;
  const SafetensorsFile f = SafetensorsFile::open(file(task));
  BestAdapter b;
  try {
    b.step = std::stoll(best_meta(f, "step"));
    b.loss = std::stod(best_meta(f, "eval_loss"));
    b.state.steps = std::stoll(best_meta(f, "group_steps"));
  } catch (const std::logic_error&) {
    throw ConfigError(f.path() + ": export.best: its step or eval_loss is not a number");
  }
  if (b.step > upto) return std::nullopt;  // found after the checkpoint this run goes on from
  const int g = task + 1;
  b.state.group = g;
  for (int p : groups.members[static_cast<size_t>(g)]) {
    const NamedParam& np = groups[p];
    const StTensor* t = f.find(np.name);
    if (!t || t->dtype != "F32" || t->shape != np.tensor.sizes().vec())
      throw ConfigError(f.path() + ": export.best: tensor '" + np.name + "' is missing or of another shape or dtype "
                        "than this job's (the model changed since: start anew with --no-resume)");
    torch::Tensor v = torch::empty(np.tensor.sizes(), torch::kFloat32);
    f.read(*t, [&](const char* bytes) { std::memcpy(v.data_ptr<float>(), bytes, static_cast<size_t>(v.nbytes())); });
    b.state.names.push_back(np.name);
    b.state.params.push_back(v);
  }
  return b;
}

void BestAdapters::save(int task, const BestAdapter& best) const {
  if (dir_.empty()) return;
  if (const std::string why = safe_file::make_dirs(dir_, true); !why.empty())
    throw Error(dir_ + ": export.best: cannot keep the best adapters there: " + why);
  std::vector<torch::Tensor> held;
  std::vector<StWriteTensor> tensors;
  for (size_t k = 0; k < best.state.params.size(); ++k) {
    held.push_back(best.state.params[k].to(torch::kCPU, torch::kFloat32).contiguous());
    const torch::Tensor& t = held.back();
    tensors.push_back({best.state.names[k], "F32", t.sizes().vec(), t.data_ptr(), static_cast<size_t>(t.nbytes())});
  }
  char loss[40];
  std::snprintf(loss, sizeof loss, "%.17g", best.loss);  // read back exactly
  write_safetensors(file(task), tensors, {{"step", std::to_string(best.step)}, {"eval_loss", loss}, {"group_steps", std::to_string(best.state.steps)}});
}

}  // namespace thetad::daemon
