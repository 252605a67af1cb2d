// TorchScript models (model.kind: torchscript): a module with forward(x, task) loaded from
// model.path, its parameters' groups from the job's name patterns.
#include <torch/script.h>

#include <filesystem>
#include <sstream>

#include "common/errors.hpp"
#include "common/text.hpp"
#include "daemon/models/kinds.hpp"

namespace thetad::daemon {
namespace {

// '*' matches any run of characters (including dots); everything else literally.
bool glob_match(const std::string& pat, const std::string& s) {
  size_t p = 0, i = 0, star = std::string::npos, mark = 0;
  while (i < s.size()) {
    if (p < pat.size() && pat[p] == s[i]) {
      ++p, ++i;
    } else if (p < pat.size() && pat[p] == '*') {
      star = p++, mark = i;
    } else if (star != std::string::npos) {
      p = star + 1, i = ++mark;
    } else {
      return false;
    }
  }
  while (p < pat.size() && pat[p] == '*') ++p;
  return p == pat.size();
}

// A TorchScript module with forward(x, task); groups from the job's name patterns.
class ScriptModel : public TaskModel {
 public:
  ScriptModel(const config::Job& job, torch::Device device) {
    const auto& m = job.model;
    num_tasks_ = static_cast<int>(m.tasks);
    path_ = m.path;
    // Checked before opening: a FIFO would block the load until a writer comes.
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path_, ec))
      throw ConfigError(path_ + ": model.path: " + (std::filesystem::exists(path_, ec) ? "not a regular file" : "no such file") +
                        " (a TorchScript model file, torch.jit.save)");
    try {
      module_ = torch::jit::load(path_, device);
    } catch (const c10::Error& e) {
      throw ConfigError(path_ + ": model.path: cannot load TorchScript model: " +
                        e.what_without_backtrace());
    }
    check_contract(path_);
    module_.train();
    std::vector<std::string> problems;
    for (const auto& np : module_.named_parameters(/*recurse=*/true)) {
      // Every pattern that matches, named, so that "matched by 2 patterns" says which two.
      std::vector<int> groups;
      std::vector<std::string> matched;
      for (const auto& s : m.shared)
        if (glob_match(s, np.name)) {
          groups.push_back(0);
          matched.push_back("model.shared '" + s + "'");
        }
      for (int64_t t = 0; t < m.tasks; ++t)
        for (const auto& pattern : m.task)
          if (glob_match(replace_all(pattern, "{t}", std::to_string(t)), np.name)) {
            groups.push_back(int(t) + 1);
            matched.push_back("model.task '" + pattern + "' (task " + std::to_string(t) + ")");
          }
      // Several shared patterns, or several task patterns of the same task, agree on the group.
      std::sort(groups.begin(), groups.end());
      groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
      if (groups.size() != 1) {
        std::string which;
        for (const auto& w : matched) which += (which.empty() ? "" : ", ") + w;
        problems.push_back(path_ + ": parameter '" + np.name + "' is matched by " +
                           (groups.empty() ? std::string("no pattern of model.shared/model.task")
                                           : std::to_string(groups.size()) + " groups' patterns: " + which));
        continue;
      }
      torch::Tensor t = np.value;
      t.set_requires_grad(true);
      params_.push_back({np.name, t, groups[0], nullptr});
    }
    if (!problems.empty()) {
      std::string all;
      for (const auto& p : problems) all += (all.empty() ? "" : "\n") + p;
      throw ConfigError(all);
    }
  }
  std::vector<NamedParam>& params() override { return params_; }
  torch::Tensor forward(const torch::Tensor& x, int task) override {
    return module_.forward({x, static_cast<int64_t>(task)}).toTensor();
  }
  // Token batches (data.kind: tokens): forward returns logits [rows, seq, vocab], trained on the
  // next tokens as the built-in transformer is.
  // Float batches: the output must have the targets' shape ([rows, model.output_dim]); MSE of
  // another shape would broadcast and train on nonsense.
  torch::Tensor loss(const Batch& b, int task, uint64_t sample_seed) override {
    (void)sample_seed;
    if (b.x.scalar_type() == torch::kInt64) return next_token_loss(forward(b.x, task), b.y);
    const torch::Tensor out = forward(b.x, task);
    if (!out.sizes().equals(b.y.sizes())) {
      std::ostringstream os;
      os << path_ << ": model.path: the model's output for task " << task << " has shape " << out.sizes()
         << " where its targets have shape " << b.y.sizes() << " (rows x model.output_dim); forward must return "
         << "one row of model.output_dim values per input row";
      throw ConfigError(os.str());
    }
    return task_loss(loss_kind(), out, b.y);
  }

  // What thetad calls, checked when the model is loaded (bad input: exit 2 before any step, not
  // an interpreter error in the first forward).
  void check_contract(const std::string& path) {
    static const char* kExpected =
        "forward(self, x: Tensor, task: int) -> Tensor (a batch of one task's rows and the 0-based task "
        "index, returning that task's output)";
    auto method = module_.find_method("forward");
    if (!method) throw ConfigError(path + ": model.path: the TorchScript model has no forward; thetad calls " + kExpected);
    const c10::FunctionSchema& schema = method->function().getSchema();
    const auto& args = schema.arguments();  // self first
    const auto& rets = schema.returns();
    const bool ok = args.size() == 3 && args[1].type()->kind() == c10::TypeKind::TensorType &&
                    args[2].type()->kind() == c10::TypeKind::IntType && rets.size() == 1 &&
                    rets[0].type()->kind() == c10::TypeKind::TensorType;
    if (ok) return;
    std::ostringstream os;
    os << schema;
    throw ConfigError(path + ": model.path: the model's forward is " + os.str() + "; thetad calls " + kExpected);
  }
  LossKind loss_kind() const override { return LossKind::mse; }

 private:
  torch::jit::script::Module module_;
  std::string path_;  // model.path, {job} and {rank} expanded
  std::vector<NamedParam> params_;
};

}  // namespace

std::unique_ptr<TaskModel> make_script_model(const config::Job& job, torch::Device device) {
  return std::make_unique<ScriptModel>(job, device);
}

}  // namespace thetad::daemon
