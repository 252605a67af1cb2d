// Built-in models (multitask_mlp, multitask_adapter, extreme_classifier; the transformer has a
// file of its own), TorchScript models with groups from name patterns, and the synthetic teacher
// data.
#include <torch/script.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "common/errors.hpp"
#include "common/hash.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "daemon/plan/input_path.hpp"
#include "daemon/models/chunked_softmax.hpp"
#include "daemon/models/fused_cross_entropy.hpp"
#include "daemon/models/initial_weights.hpp"
#include "daemon/models/model.hpp"
#include "daemon/models/param_builder.hpp"
#include "daemon/models/precision.hpp"
#include "daemon/models/transformer.hpp"
#include "daemon/models/trunk_layer.hpp"

namespace thetad::daemon {
namespace {

using namespace detail;

// Runs Linear+GELU layers through trunk_layer (layer i = index i of `layers`).
torch::Tensor run_trunk(const std::vector<Linear>& layers, torch::Tensor h, LayerWeights* weights,
                        ActivationStash* stash) {
  for (size_t i = 0; i < layers.size(); ++i)
    h = trunk_layer(h, layers[i].w, layers[i].b, TrunkAct::gelu, static_cast<int>(i), weights, stash);
  return h;
}

// Shared trunk of Linear+GELU layers, one head per task (Linear+GELU ..., Linear).
class MultitaskMlp : public TaskModel {
 public:
  MultitaskMlp(const config::Job& job, torch::Device device, bool lazy) {
    const auto& m = job.model;
    num_tasks_ = static_cast<int>(m.tasks);
    ParamBuilder pb(job, device, params_, lazy);
    int64_t dim = m.input_dim;
    for (int64_t i = 0; i < m.trunk_layers; ++i) {
      trunk_.push_back(make_linear(pb, "trunk." + std::to_string(i), 0, dim, m.hidden));
      dim = m.hidden;
    }
    heads_.resize(m.tasks);
    for (int64_t t = 0; t < m.tasks; ++t) {
      int64_t d = dim;
      for (int64_t i = 0; i < m.head_layers; ++i) {
        int64_t out = (i + 1 == m.head_layers) ? m.output_dim : m.hidden;
        heads_[t].push_back(make_linear(
            pb, "heads." + std::to_string(t) + "." + std::to_string(i), int(t) + 1, d, out));
        d = out;
      }
    }
  }
  std::vector<NamedParam>& params() override { return params_; }
  torch::Tensor forward(const torch::Tensor& x, int task) override {
    torch::Tensor h = run_trunk(trunk_, x, weights_, stash_);
    const auto& head = heads_.at(task);
    for (size_t i = 0; i < head.size(); ++i) {
      h = head[i](h);
      if (i + 1 < head.size()) h = torch::gelu(h);
    }
    return h;
  }
  LossKind loss_kind() const override { return LossKind::mse; }
  bool has_trunk_layers() const override { return true; }
  void set_layer_weights(LayerWeights* weights) override { weights_ = weights; }
  void set_activation_stash(ActivationStash* stash) override { stash_ = stash; }

 private:
  std::vector<NamedParam> params_;
  std::vector<Linear> trunk_;
  std::vector<std::vector<Linear>> heads_;
  LayerWeights* weights_ = nullptr;
  ActivationStash* stash_ = nullptr;
};

// Residual trunk blocks h + W2 gelu(W1 h), each with a low-rank adapter per task
// (h + B_t A_t h), and a per-task linear head. θ[t] = the task's adapters and head.
class MultitaskAdapter : public TaskModel {
 public:
  MultitaskAdapter(const config::Job& job, torch::Device device, bool lazy) {
    const auto& m = job.model;
    num_tasks_ = static_cast<int>(m.tasks);
    ParamBuilder pb(job, device, params_, lazy);
    in_ = make_linear(pb, "embed", 0, m.input_dim, m.hidden);
    int64_t blocks = std::max<int64_t>(m.trunk_layers, 1);
    for (int64_t i = 0; i < blocks; ++i) {
      std::string n = "blocks." + std::to_string(i);
      blocks_.push_back({make_linear(pb, n + ".fc1", 0, m.hidden, m.hidden),
                         make_linear(pb, n + ".fc2", 0, m.hidden, m.hidden)});
    }
    adapters_.resize(m.tasks);
    heads_.resize(m.tasks);
    for (int64_t t = 0; t < m.tasks; ++t) {
      int g = int(t) + 1;
      for (int64_t i = 0; i < blocks; ++i) {
        std::string n = "adapters." + std::to_string(t) + "." + std::to_string(i);
        Adapter a;
        a.down = pb.add(n + ".down", g, {m.adapter_rank, m.hidden}, 1.0 / std::sqrt(double(m.hidden)));
        a.up = pb.add(n + ".up", g, {m.hidden, m.adapter_rank}, 1.0 / std::sqrt(double(m.adapter_rank)));
        adapters_[t].push_back(a);
      }
      heads_[t] = make_linear(pb, "heads." + std::to_string(t), g, m.hidden, m.output_dim);
    }
  }
  std::vector<NamedParam>& params() override { return params_; }
  torch::Tensor forward(const torch::Tensor& x, int task) override {
    torch::Tensor h = torch::gelu(in_(x));
    for (size_t i = 0; i < blocks_.size(); ++i) {
      h = h + blocks_[i].second(torch::gelu(blocks_[i].first(h)));
      const auto& a = adapters_.at(task)[i];
      h = h + torch::matmul(torch::matmul(h, a.down.t()), a.up.t());
    }
    return heads_.at(task)(h);
  }
  LossKind loss_kind() const override { return LossKind::mse; }

 private:
  struct Adapter {
    torch::Tensor down, up;
  };
  std::vector<NamedParam> params_;
  Linear in_;
  std::vector<std::pair<Linear, Linear>> blocks_;
  std::vector<std::vector<Adapter>> adapters_;
  std::vector<Linear> heads_;
};

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
    path_ = input_path(m.path, job);
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

// Extreme classification: a shared encoder (Θ) and an output layer of `classes` rows split into
// `tasks` row slices, slice t = θ[t]. A batch of task t holds samples whose labels lie in slice
// t; the softmax runs over the batch's label classes plus `negatives_per_step` classes sampled
// from the slice (all of the slice when 0).
// With offload.shard_mb > 0 a slice is one parameter `output.<t>.weight_bias`, [rows x
// (hidden+1)] with the bias as its last column (same initial values as weight and bias), and the
// full softmax streams it in chunks of shard_mb worth of rows — from the store's row shards
// when offloaded, else from the parameter itself, in the same chunks either way.
class ExtremeClassifier : public TaskModel {
 public:
  ExtremeClassifier(const config::Job& job, torch::Device device, bool lazy)
      : negatives_(job.model.negatives_per_step), sharded_(job.offload.shard_mb > 0) {
    const auto& m = job.model;
    num_tasks_ = static_cast<int>(m.tasks);
    ParamBuilder pb(job, device, params_, lazy);
    int64_t dim = m.input_dim;
    for (int64_t i = 0; i < std::max<int64_t>(m.trunk_layers, 1); ++i) {
      encoder_.push_back(make_linear(pb, "encoder." + std::to_string(i), 0, dim, m.hidden));
      dim = m.hidden;
    }
    std::vector<torch::Tensor> mats;
    for (int64_t t = 0; t < m.tasks; ++t) {
      const int64_t rows = m.classes / m.tasks + (t < m.classes % m.tasks ? 1 : 0);
      const std::string name = "output." + std::to_string(t);
      const int g = int(t) + 1;
      if (!sharded_) {
        slices_.push_back(make_linear(pb, name, g, dim, rows));
        continue;
      }
      mats.push_back(pb.add_weight_bias(name + ".weight_bias", g, rows, dim, 1.0 / std::sqrt(double(dim))));
    }
    if (sharded_) {
      const int64_t chunk_rows = static_cast<int64_t>(job.offload.shard_bytes() / ((dim + 1) * sizeof(float)));
      THETAD_CHECK(chunk_rows >= 1, ConfigError, job.source, ": offload.shard_mb: one row of the output layer is ",
                   (dim + 1) * sizeof(float), " bytes, more than the shard");
      own_ = ResidentChunks(mats, chunk_rows);
    }
    mats_ = std::move(mats);
  }
  std::vector<NamedParam>& params() override { return params_; }
  bool row_chunked(int group) const override { return sharded_ && group >= 1; }
  void set_shard_source(ShardSource* source) override { source_ = source; }
  bool has_trunk_layers() const override { return true; }
  void set_layer_weights(LayerWeights* weights) override { weights_ = weights; }
  void set_activation_stash(ActivationStash* stash) override { stash_ = stash; }
  torch::Tensor features(const torch::Tensor& x) { return run_trunk(encoder_, x, weights_, stash_); }
  torch::Tensor forward(const torch::Tensor& x, int task) override {
    if (sharded_) return chunked_logits(features(x), chunks(), task);
    return slices_.at(task)(features(x));
  }
  LossKind loss_kind() const override { return LossKind::cross_entropy; }
  torch::Tensor loss(const Batch& b, int task, uint64_t sample_seed) override {
    const int64_t rows = sharded_ ? mats_.at(task).size(0) : slices_.at(task).w.size(0);
    const bool sampled = negatives_ > 0 && negatives_ < rows;
    if (sharded_ && !sampled) return chunked_softmax_xent(features(b.x), mats_.at(task), b.y, chunks(), task);
    if (!sampled) return task_loss(loss_kind(), forward(b.x, task), b.y);
    // Sampled softmax: the label classes and sampled negatives, deduplicated and sorted.
    auto gen = generator(sample_seed);
    auto neg = torch::randint(rows, {negatives_}, gen, torch::kInt64).to(b.y.device());
    auto cls = std::get<0>(torch::_unique(torch::cat({b.y, neg}), /*sorted=*/true));
    if (sharded_) return chunked_sampled_softmax_xent(features(b.x), mats_.at(task), b.y, cls, chunks(), task);
    const Linear& out = slices_.at(task);
    auto target = torch::searchsorted(cls, b.y);
    auto logits = torch::addmm(out.b.index_select(0, cls), features(b.x), out.w.index_select(0, cls).t());
    return task_loss(loss_kind(), logits, target);
  }

 private:
  ShardSource& chunks() { return source_ ? *source_ : own_; }

  int64_t negatives_;
  bool sharded_;
  std::vector<NamedParam> params_;
  std::vector<Linear> encoder_;
  std::vector<Linear> slices_;     // unsharded
  std::vector<torch::Tensor> mats_;  // sharded: [rows x (hidden+1)] per slice
  ResidentChunks own_;
  ShardSource* source_ = nullptr;
  LayerWeights* weights_ = nullptr;
  ActivationStash* stash_ = nullptr;
};

// Synthetic classification for the extreme classifier: per slice a fixed random linear teacher;
// the label is the teacher's argmax over the slice's classes.
class SyntheticClasses : public DataSource {
 public:
  SyntheticClasses(const config::Job& job, torch::Device device)
      : seed_(job.seed), in_(job.model.input_dim), device_(device) {
    for (int64_t t = 0; t < job.model.tasks; ++t) {
      const int64_t rows = job.model.classes / job.model.tasks + (t < job.model.classes % job.model.tasks ? 1 : 0);
      auto gen = generator(mix_seed(seed_, 0xc1a55, static_cast<uint64_t>(t)));
      teachers_.push_back(torch::randn({in_, rows}, gen, torch::kFloat32));
    }
  }
  Batch batch(int64_t step, int rank, int world, int task, int64_t rows) override {
    (void)world;
    auto gen = generator(mix_seed(seed_, static_cast<uint64_t>(step), static_cast<uint64_t>(rank),
                                  static_cast<uint64_t>(task) + 1));
    auto x = torch::randn({rows, in_}, gen, torch::kFloat32);
    auto y = torch::matmul(x, teachers_.at(task)).argmax(1);
    return {x.to(device_), y.to(device_)};
  }

 private:
  uint64_t seed_;
  int64_t in_;
  torch::Device device_;
  std::vector<torch::Tensor> teachers_;
};

// Synthetic regression: per task a fixed random two-layer teacher y = tanh(x A_t) B_t + noise.
class SyntheticData : public DataSource {
 public:
  SyntheticData(const config::Job& job, torch::Device device)
      : seed_(job.seed), in_(job.model.input_dim), out_(job.model.output_dim),
        noise_(job.data.noise), device_(device) {
    const int64_t k = 16;
    for (int64_t t = 0; t < job.model.tasks; ++t) {
      auto gen = generator(mix_seed(seed_, 0x7eac4e2, static_cast<uint64_t>(t)));
      auto a = torch::randn({in_, k}, gen, torch::kFloat32) / std::sqrt(double(in_));
      auto b = torch::randn({k, out_}, gen, torch::kFloat32) / std::sqrt(double(k));
      teachers_.push_back({a.to(device), b.to(device)});
    }
  }
  Batch batch(int64_t step, int rank, int world, int task, int64_t rows) override {
    (void)world;
    auto gen = generator_on(mix_seed(seed_, static_cast<uint64_t>(step), static_cast<uint64_t>(rank),
                                     static_cast<uint64_t>(task) + 1),
                            device_);
    const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
    auto x = torch::randn({rows, in_}, gen, opts);
    const auto& [a, b] = teachers_.at(task);
    auto y = torch::matmul(torch::tanh(torch::matmul(x, a) * 2.0), b);
    if (noise_ > 0) y = y + noise_ * torch::randn({rows, out_}, gen, opts);
    return {x, y};
  }

 private:
  uint64_t seed_;
  int64_t in_, out_;
  double noise_;
  torch::Device device_;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> teachers_;
};

}  // namespace

uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  return splitmix64(splitmix64(splitmix64(splitmix64(a) ^ b) ^ c) ^ d);
}

namespace {

std::unique_ptr<TaskModel> build_model(const config::Job& job, torch::Device device, bool lazy_tasks) {
  using config::ModelKind;
  switch (job.model.kind) {
    case ModelKind::MultitaskMlp: return std::make_unique<MultitaskMlp>(job, device, lazy_tasks);
    case ModelKind::MultitaskAdapter: return std::make_unique<MultitaskAdapter>(job, device, lazy_tasks);
    case ModelKind::Torchscript: return std::make_unique<ScriptModel>(job, device);
    case ModelKind::ExtremeClassifier: return std::make_unique<ExtremeClassifier>(job, device, lazy_tasks);
    case ModelKind::Transformer: return make_transformer(job, device, lazy_tasks);
  }
  throw InternalError("make_model: model.kind " + std::to_string(static_cast<int>(job.model.kind)) +
                      " has no model");
}

// A frozen base in bf16 (frozen_base_in_bf16): says what the base holds how, once loaded.
void log_frozen_base(const config::Job& job, TaskModel& model) {
  if (!frozen_base_in_bf16(job)) return;
  int64_t bf16_bytes = 0, fp32_bytes = 0;
  for (NamedParam& p : model.params()) {
    if (p.group != 0) continue;
    (p.tensor.scalar_type() == torch::kBFloat16 ? bf16_bytes : fp32_bytes) += p.tensor.numel() * p.tensor.element_size();
  }
  THETAD_LOG(info, "train") << "frozen base held in bf16 (precision: bf16, model.train_shared: false): "
                            << bf16_bytes / 1e6 << " MB in bf16, " << fp32_bytes / 1e6
                            << " MB kept in float32 (read outside autocast's casts)";
}

}  // namespace

std::unique_ptr<TaskModel> make_model(const config::Job& job, torch::Device device, bool lazy_tasks) {
  std::unique_ptr<TaskModel> model = build_model(job, device, lazy_tasks);
  load_initial_weights(job, *model);
  hold_embedding_in_bf16(job, *model);
  log_frozen_base(job, *model);
  return model;
}

std::unique_ptr<DataSource> make_npy_data(const config::Job& job, const TaskModel& model,
                                          torch::Device device);

std::unique_ptr<DataSource> make_data(const config::Job& job, const TaskModel& model,
                                      torch::Device device) {
  if (job.model.kind == config::ModelKind::Transformer || job.data.kind == config::DataKind::Tokens)
    return make_token_data(job, device);
  const bool synthetic = job.data.kind == config::DataKind::Synthetic;
  if (synthetic && model.loss_kind() == LossKind::cross_entropy)
    return std::make_unique<SyntheticClasses>(job, device);
  if (synthetic) return std::make_unique<SyntheticData>(job, device);
  return make_npy_data(job, model, device);
}

torch::Tensor TaskModel::loss(const Batch& batch, int task, uint64_t sample_seed) {
  (void)sample_seed;
  return task_loss(loss_kind(), forward(batch.x, task), batch.y);
}

std::vector<torch::Tensor> TaskModel::losses(const std::vector<TaskRows>& parts) {
  std::vector<torch::Tensor> out;
  out.reserve(parts.size());
  for (const TaskRows& p : parts) out.push_back(loss(*p.batch, p.task, p.sample_seed));
  return out;
}

PassInputs pass_inputs(DataSource& data, const StepPlan& plan, size_t first, size_t end, int64_t micro, int rank,
                       int world, uint64_t seed) {
  PassInputs in;
  in.batches.reserve(end - first);  // parts point into it
  for (size_t i = first; i < end; ++i) {
    const int task = plan.tasks[i];
    if (plan.task_rows[i] == 0) continue;
    in.rows.push_back(plan.task_rows[i]);
    in.batches.push_back(data.batch(micro, rank, world, task, in.rows.back()));
    in.parts.push_back({task, &in.batches.back(),
                        mix_seed(seed, 0x5a3b1e, static_cast<uint64_t>(micro),
                                 static_cast<uint64_t>(rank) * 1000003u + static_cast<uint64_t>(task))});
  }
  return in;
}

torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& next) {
  return fused_cross_entropy(logits.reshape({-1, logits.size(-1)}), next.reshape({-1}));
}

torch::Tensor task_loss(LossKind kind, const torch::Tensor& out, const torch::Tensor& y) {
  // Losses in float32 whatever forward computed in (precision: bf16), as autocast does on GPUs;
  // a no-op for float32 outputs.
  const torch::Tensor out32 = out.to(torch::kFloat32);
  if (kind == LossKind::mse) return torch::mse_loss(out32, y);
  return torch::nn::functional::cross_entropy(out32, y);
}

}  // namespace thetad::daemon
