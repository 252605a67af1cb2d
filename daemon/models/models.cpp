// The models' and data sources' factories (make_model, make_data) and what every model shares
// (its default losses, a pass's inputs, the losses of an output), the multitask MLP models
// (multitask_mlp, multitask_adapter) and their synthetic teacher data. The other kinds have files
// of their own (kinds.hpp).
#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "common/errors.hpp"
#include "common/hash.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "daemon/ops/fused_cross_entropy.hpp"
#include "daemon/models/initial_weights.hpp"
#include "daemon/models/model.hpp"
#include "daemon/models/kinds.hpp"
#include "daemon/models/param_builder.hpp"
#include "daemon/ops/nf4.hpp"
#include "daemon/ops/precision.hpp"
#include "daemon/models/transformer.hpp"
#include "daemon/ops/trunk_layer.hpp"
#include "daemon/plan/memory_estimate.hpp"

namespace thetad::daemon {

torch::Tensor detail::run_trunk(const std::vector<Linear>& layers, torch::Tensor h, LayerWeights* weights,
                                ActivationStash* stash) {
  for (size_t i = 0; i < layers.size(); ++i)
    h = trunk_layer(h, layers[i].w, layers[i].b, TrunkAct::gelu, static_cast<int>(i), weights, stash);
  return h;
}

namespace {

using namespace detail;

// Shared trunk of Linear+GELU layers, one head per task (Linear+GELU ..., Linear).
class MultitaskMlp : public TaskModel {
 public:
  MultitaskMlp(const config::Job& job, const Placement& place, torch::Device device, bool lazy) {
    const auto& m = job.model;
    num_tasks_ = static_cast<int>(m.tasks);
    ParamBuilder pb(job, place, device, params_, lazy);
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
  MultitaskAdapter(const config::Job& job, const Placement& place, torch::Device device, bool lazy) {
    const auto& m = job.model;
    num_tasks_ = static_cast<int>(m.tasks);
    ParamBuilder pb(job, place, device, params_, lazy);
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

std::unique_ptr<TaskModel> build_model(const config::Job& job, const Placement& place, torch::Device device,
                                       bool lazy_tasks) {
  using config::ModelKind;
  switch (job.model.kind) {
    case ModelKind::MultitaskMlp: return std::make_unique<MultitaskMlp>(job, place, device, lazy_tasks);
    case ModelKind::MultitaskAdapter: return std::make_unique<MultitaskAdapter>(job, place, device, lazy_tasks);
    case ModelKind::Torchscript: return make_script_model(job, device);
    case ModelKind::ExtremeClassifier: return make_extreme_classifier(job, place, device, lazy_tasks);
    case ModelKind::Transformer: return make_transformer(job, place, device, lazy_tasks);
  }
  throw InternalError("make_model: model.kind " + std::to_string(static_cast<int>(job.model.kind)) +
                      " has no model");
}

// A frozen base held in bf16 (Placement::frozen_base_bf16): the token embedding, which forward reads by
// index (widened to float32) besides any matmul, joins the bf16 matrices where its values are
// bf16 already (a bf16 checkpoint's, after model.init_from): nothing forward computes changes.
// A quantized base (model.base_quant) holds it in bf16 whatever its values, as QLoRA does: that
// base computes another function than the float32 one anyway, and a drawn embedding in float32
// would be a quarter of a 1 B base's device memory in nf4.
void hold_embedding_in_bf16(const config::Job& job, const Placement& place, TaskModel& model) {
  if (!place.frozen_base_bf16 || job.model.kind != config::ModelKind::Transformer) return;
  const bool quantized = job.model.base_quant != config::BaseQuant::None;
  torch::NoGradGuard no_grad;
  for (NamedParam& p : model.params()) {
    if (p.group != 0 || p.name != "embed.weight" || p.tensor.scalar_type() != torch::kFloat32) continue;
    torch::Tensor held = p.tensor.detach().to(torch::kBFloat16);
    if (quantized || held.to(torch::kFloat32).equal(p.tensor.detach())) p.tensor.set_data(held);  // the model's handle too
  }
}

// log_frozen_base's words for a streamed or sharded base's layers (none where the base is resident).
std::string streamed_layers(int64_t numel) {
  return numel == 0 ? std::string()
                    : "; the layers' " + std::to_string(numel) + " matrix values in host memory, brought in a layer at a time";
}

// A frozen base in bf16 (Placement::frozen_base_bf16) or nf4 (model.base_quant): says what the
// base holds how, once loaded.
void log_frozen_base(const config::Job& job, const Placement& place, TaskModel& model) {
  const bool quantized = job.model.base_quant != config::BaseQuant::None;
  if (!place.frozen_base_bf16 && !quantized) return;
  // A streamed or sharded base's layers go to host memory later (homes/streamed_base.hpp; the
  // offload log says how many bytes they take there): not counted here, whatever they hold now.
  std::set<const c10::TensorImpl*> streamed;
  int64_t streamed_numel = 0;
  if (place.streamed_base)
    for (const BaseGemm& g : model.frozen_gemms())
      for (const torch::Tensor& w : g.weights)
        if (g.layer >= 0 && streamed.insert(w.unsafeGetTensorImpl()).second) streamed_numel += w.numel();
  int64_t bf16_bytes = 0, fp32_bytes = 0, host_bytes = 0, host_numel = 0;
  for (NamedParam& p : model.params()) {
    if (p.group != 0 || streamed.count(p.tensor.unsafeGetTensorImpl())) continue;
    // A resident base's placeholders not quantized: drawn where they will live.
    if (p.init && !p.host_only) continue;
    const int64_t bytes = p.tensor.numel() * p.tensor.element_size();
    if (p.host_only) {
      host_bytes += p.init ? 0 : bytes;  // a drawn base's placeholders hold nothing
      host_numel += p.tensor.numel();
      continue;
    }
    (p.tensor.scalar_type() == torch::kBFloat16 ? bf16_bytes : fp32_bytes) += bytes;
  }
  if (quantized) {
    // 4 bits a value and a bf16 absmax per block (daemon/ops/nf4.hpp).
    static_assert(0.5 + double(kNf4AbsmaxBytes) / double(kNf4Block) == kNf4BytesPerValue,
                  "the memory estimates count nf4's bytes as the format holds them");
    const double nf4_bytes = double(host_numel) * kNf4BytesPerValue;
    THETAD_LOG(info, "train") << "frozen base in " << to_string(job.model.base_quant) << " (model.base_quant): "
                              << host_numel << " matrix values in " << nf4_bytes / 1e6 << " MB on the device ("
                              << (host_bytes == 0 ? std::string("drawn from the seed as quantized, held nowhere else")
                                                  : "their " + std::to_string(host_bytes / 1000000) + " MB of " +
                                                        (host_bytes == 2 * host_numel ? "bf16" : "float32") +
                                                        " values in host memory")
                              << "), " << (bf16_bytes + fp32_bytes) / 1e6 << " MB of embeddings and norms as loaded"
                              << streamed_layers(streamed_numel);
    return;
  }
  THETAD_LOG(info, "train") << "frozen base held in bf16 (precision: bf16, model.train_shared: false): "
                            << bf16_bytes / 1e6 << " MB in bf16, " << fp32_bytes / 1e6
                            << " MB kept in float32 (read outside autocast's casts)" << streamed_layers(streamed_numel);
}

}  // namespace

std::unique_ptr<TaskModel> make_model(const config::Job& job, const Placement& place, torch::Device device,
                                      bool lazy_tasks, torch::Device compute) {
  std::unique_ptr<TaskModel> model = build_model(job, place, device, lazy_tasks);
  load_initial_weights(job, *model);
  hold_embedding_in_bf16(job, place, *model);
  if (job.model.base_quant != config::BaseQuant::None) model->quantize_frozen_base(compute);
  log_frozen_base(job, place, *model);
  return model;
}

std::unique_ptr<TaskModel> make_model(const config::Job& job, torch::Device device, bool lazy_tasks,
                                      torch::Device compute) {
  return make_model(job, Placement::of(job, 1), device, lazy_tasks, compute);
}

std::unique_ptr<DataSource> make_data(const config::Job& job, const TaskModel& model,
                                      torch::Device device) {
  if (job.model.kind == config::ModelKind::Transformer || job.data.kind == config::DataKind::Tokens)
    return make_token_data(job, device);
  const bool synthetic = job.data.kind == config::DataKind::Synthetic;
  if (synthetic && model.loss_kind() == LossKind::cross_entropy)
    return make_synthetic_classes(job, device);
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
