// The model section of a job: its kind, sizes, the transformer and TorchScript settings, and
// whether the model fits the limits of this build (Checker, checker.hpp).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "config/checker.hpp"
#include "config/lora_adapter.hpp"

namespace thetad::config::detail {

void Checker::model() {
  const ModelConfig& m = j_.model;
  one_of("model.kind");
  one_of("model.arch");
  one_of("data.token_dtype");  // (the llama keys are checked together here)
  above<int64_t>("model.tasks", m.tasks, 0);
  above<int64_t>("model.input_dim", m.input_dim, 0);
  above<int64_t>("model.hidden", m.hidden, 0);
  above<int64_t>("model.output_dim", m.output_dim, 0);
  at_least<int64_t>("model.trunk_layers", m.trunk_layers, 0);
  at_least<int64_t>("model.head_layers", m.head_layers, 1);
  at_most<int64_t>("model.tasks", m.tasks, kMaxTasks, "task groups, each with its own parameters");
  for (const auto& [key, v] : {std::pair<const char*, int64_t>{"model.input_dim", m.input_dim},
                               {"model.hidden", m.hidden}, {"model.output_dim", m.output_dim}})
    at_most<int64_t>(key, v, kMaxDim, "a layer dimension; a square layer of it is 1 PiB");
  at_most<int64_t>("model.trunk_layers", m.trunk_layers, kMaxLayers, "layers");
  at_most<int64_t>("model.head_layers", m.head_layers, kMaxLayers, "layers");
  at_most<int64_t>("model.classes", m.classes, int64_t{1} << 32, "output rows");
  at_least<int64_t>("model.init_seed", m.init_seed, -1);
  if (!m.init_from.empty() && ok("model.init_from")) {
    std::error_code ec;
    if (!std::filesystem::exists(m.init_from, ec))
      fail("model.init_from", (ec && ec != std::errc::no_such_file_or_directory ? "cannot read '" + m.init_from + "': " + ec.message()
                                   : "no such file or directory: '" + m.init_from + "'") +
                                  " (a torch.save'd state dict, a checkpoint group file, a .safetensors file or a "
                                  "Hugging Face model directory)");
  }
  if (!ok("model.kind") || unknown("model.kind")) return;
  if (m.kind == ModelKind::MultitaskAdapter) {
    at_least<int64_t>("model.adapter_rank", m.adapter_rank, 1);
    at_most<int64_t>("model.adapter_rank", m.adapter_rank, kMaxDim, "a layer dimension");
  } else if (m.kind == ModelKind::ExtremeClassifier) {
    if (m.classes <= 0) {
      fail("model.classes", "extreme_classifier needs classes > 0, got " + num(m.classes),
           "model.kind");
    } else if (ok("model.tasks") && m.tasks > 0 && m.classes < m.tasks) {
      fail("model.classes", "must be >= model.tasks (" + num(m.tasks) +
                                "): each task owns a slice of the output layer; got " +
                                num(m.classes));
    }
    at_least<int64_t>("model.negatives_per_step", m.negatives_per_step, 0);
    if (m.classes > 0 && m.negatives_per_step > m.classes)
      fail("model.negatives_per_step", "must be <= model.classes (" + num(m.classes) +
                                           "), got " + num(m.negatives_per_step));
  } else if (m.kind == ModelKind::Torchscript) {
    torchscript();
  } else if (m.kind == ModelKind::Transformer) {
    transformer();
  }
  if (m.kind != ModelKind::Torchscript && m.kind != ModelKind::Transformer) model_size();
  base_quant();
  base_shard();
}

// model.base_quant: only a frozen transformer base is held in 4 bits (the adapters train on it;
// a base that trains would need its own full-precision values and their gradients).
void Checker::base_quant() {
  const ModelConfig& m = j_.model;
  one_of("model.base_quant");
  if (m.base_quant == BaseQuant::None || !ok("model.base_quant")) return;
  if (m.kind != ModelKind::Transformer)
    fail("model.base_quant", to_string(m.base_quant) + " quantizes the transformer's frozen base; model.kind is " +
                                 to_string(m.kind), "model.kind");
  else if (m.train_shared)
    fail("model.base_quant", to_string(m.base_quant) + " holds a frozen base, but model.train_shared is " +
                                 (d_.given("model.train_shared") ? "true" : "true (the default)") +
                                 ": set model.train_shared: false to train adapters on the quantized base",
         "model.train_shared");
}

// model.base_shard: node shards a frozen transformer base's layers (in the GEMMs' dtype, or nf4)
// over the node's devices and gathers each into a slot before use; a trained base would need its
// gradients reduced into the shards, a streamed one is held in host memory instead (choose one).
void Checker::base_shard() {
  const ModelConfig& m = j_.model;
  one_of("model.base_shard");
  if (m.base_shard == BaseShard::None || !ok("model.base_shard")) return;
  const std::string what = "node shards the transformer's frozen base over the node's ranks";
  if (m.kind != ModelKind::Transformer) {
    fail("model.base_shard", what + "; model.kind is " + to_string(m.kind), "model.kind");
    return;
  }
  if (m.train_shared)
    fail("model.base_shard", what + ", but model.train_shared is " +
                                 (d_.given("model.train_shared") ? "true" : "true (the default)") +
                                 ": set model.train_shared: false to train adapters on the sharded base",
         "model.train_shared");
  if (j_.offload.shared == SharedMode::Stream && ok("offload.shared"))
    fail("model.base_shard", what + " on the devices; with offload.shared: stream the base is held in host memory "
                                 "and copied in layer by layer: choose one", "offload.shared");
  const int64_t prefetch = j_.offload.shared_prefetch_layers;
  if (m.layers >= 1 && prefetch > m.layers - 1 && ok("model.layers") && ok("offload.shared_prefetch_layers"))
    fail("offload.shared_prefetch_layers",
         "gathers " + std::to_string(prefetch) + " layers ahead with model.base_shard: node, but the base has " +
             std::to_string(m.layers) + " layers (model.layers), so at most " + std::to_string(m.layers - 1) +
             (m.layers == 1 ? " (a base of one layer has nothing to gather ahead: set model.base_shard to none)" : ""),
         "model.base_shard");
}

// The transformer's sizes and its LoRA section; its parameter count bounded as model_size does
// for the other built-in models (daemon/models/transformer.cpp builds these shapes).
void Checker::transformer() {
  const ModelConfig& m = j_.model;
  const LoraConfig& l = j_.lora;
  const std::pair<const char*, int64_t> dims[] = {{"model.d_model", m.d_model}, {"model.d_ff", m.d_ff},
                                                  {"model.seq_len", m.seq_len}, {"model.vocab", m.vocab}};
  const auto in = [](int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
  bool sizes_ok = in(m.layers, 1, kMaxLayers) && in(m.heads, 1, kMaxDim) && in(l.rank, 1, kMaxDim);
  for (const auto& [key, v] : dims) {
    const int64_t lo = std::string(key) == "model.vocab" ? 2 : 1;
    at_least<int64_t>(key, v, lo);
    at_most<int64_t>(key, v, kMaxDim, "a layer dimension");
    sizes_ok = sizes_ok && in(v, lo, kMaxDim);
  }
  at_least<int64_t>("model.layers", m.layers, 1);
  at_most<int64_t>("model.layers", m.layers, kMaxLayers, "layers");
  at_least<int64_t>("model.heads", m.heads, 1);
  // (A llama-family model with model.head_dim has heads of that width, whatever d_model is.)
  const bool own_heads = m.head_dim > 0 && llama_family(m.arch) && !unknown("model.arch");
  if (sizes_ok && !own_heads && m.d_model % m.heads != 0)
    fail("model.heads", "must divide model.d_model (" + num(m.d_model) + ") into equal heads, got " + num(m.heads));
  llama();
  at_least<int64_t>("lora.rank", l.rank, 1);
  at_most<int64_t>("lora.rank", l.rank, kMaxDim, "a layer dimension");
  if (!(l.alpha > 0) || !std::isfinite(l.alpha)) fail("lora.alpha", "must be a finite number > 0, got " + num(l.alpha));
  const bool llama = !unknown("model.arch") && llama_family(m.arch);
  static const std::vector<std::string> kTargets = {"q", "k", "v", "o", "gate", "up", "down"};
  if (l.targets.empty()) fail("lora.targets", "needs at least one of q, k, v, o, gate, up, down");
  for (size_t i = 0; i < l.targets.size(); ++i) {
    const std::string& t = l.targets[i];
    if (std::find(kTargets.begin(), kTargets.end(), t) == kTargets.end())
      fail("lora.targets[" + std::to_string(i) + "]", "must be one of q, k, v, o, gate, up, down; got '" + t + "'");
    else if (t == "gate" && !llama && ok("model.arch"))
      fail("lora.targets[" + std::to_string(i) + "]", "'gate' is the llama MLP's gate; model.arch is gpt2", "model.arch");
    else if (std::find(l.targets.begin(), l.targets.begin() + static_cast<std::ptrdiff_t>(i), t) !=
             l.targets.begin() + static_cast<std::ptrdiff_t>(i))
      fail("lora.targets[" + std::to_string(i) + "]", "'" + t + "' is listed twice");
  }
  for (const char* key : {"model.d_model", "model.d_ff", "model.seq_len", "model.vocab", "model.layers",
                          "model.heads", "model.tasks", "lora.rank"})
    if (!ok(key)) return;
  if (!sizes_ok || m.tasks < 1 || !ok("model.head_dim") || m.head_dim < 0 || m.head_dim > kMaxDim) return;
  const double d = double(m.d_model), ff = double(m.d_ff), L = double(m.layers);
  // The attention's width: heads x their size (d_model unless model.head_dim sets it).
  const double attn = std::max(d, double(m.heads) * double(own_heads ? m.head_dim : m.d_model / m.heads));
  const double largest = std::max({double(m.vocab) * d, d * ff, d * attn});
  if (largest > kMaxTensorElems) {
    fail(double(m.vocab) * d >= d * ff ? culprit({"model.vocab", "model.d_model"}) : culprit({"model.d_ff", "model.d_model"}),
         "the largest parameter of transformer has " + num(largest) + " elements (" + fp32_size(largest) +
             "); a parameter may have at most 2^34 = " + num(kMaxTensorElems) + " elements",
         "model");
    return;
  }
  // r x (in + out) per adapted matrix, every attention width bounded by attn.
  const double per_layer_lora = LoraAdapter(l, m.layers, {m.d_model, int64_t(attn), int64_t(attn), m.d_ff}).elements_per_layer();
  // An upper bound for every architecture (llama: no positions, a third MLP matrix, kv <= heads;
  // qwen2's biases and qwen3's head norms within the 3 x attn).
  const double shared = 2 * double(m.vocab) * d + double(m.seq_len) * d + L * (4 * d * attn + 3 * d * ff + 4 * d + 3 * attn) + 2 * d;
  const double total = shared + double(m.tasks) * L * per_layer_lora;
  offload_sizes(shared, L * per_layer_lora, double(m.tasks) * L * per_layer_lora);
  if (total > kMaxModelParams)
    fail(culprit({"model.tasks", "model.d_model", "model.layers", "model.vocab", "model.d_ff", "lora.rank"}),
         "the parameters of transformer add up to " + num(total) + " elements (" + fp32_size(total) + "): " +
             num(shared) + " shared + model.tasks (" + num(m.tasks) + ") x " + num(L * per_layer_lora) +
             " per task; a model may have at most 2^38 = " + num(kMaxModelParams) + " parameters",
         "model");
}

// model.arch and its keys, lora.init_from and the export section.
void Checker::llama() {
  const ModelConfig& m = j_.model;
  if (!(m.norm_eps > 0) || !std::isfinite(m.norm_eps)) fail("model.norm_eps", "must be a finite number > 0, got " + num(m.norm_eps));
  if (!(m.rope_theta > 0) || !std::isfinite(m.rope_theta))
    fail("model.rope_theta", "must be a finite number > 0, got " + num(m.rope_theta));
  at_least<int64_t>("model.kv_heads", m.kv_heads, 0);
  at_least<int64_t>("model.head_dim", m.head_dim, 0);
  at_most<int64_t>("model.head_dim", m.head_dim, kMaxDim, "a layer dimension");
  one_of("model.rope_scaling");
  const bool llama = !unknown("model.arch") && llama_family(m.arch);
  if (llama && ok("model.heads") && m.heads >= 1 && m.kv_heads > 0 && m.heads % m.kv_heads != 0)
    fail("model.kv_heads", "must divide model.heads (" + num(m.heads) + ") into equal groups, got " + num(m.kv_heads));
  const int64_t size = m.head_size();
  if (llama && ok("model.heads") && ok("model.d_model") && ok("model.head_dim") && m.heads >= 1 && size > 0 &&
      (m.head_dim > 0 || m.d_model % m.heads == 0) && size % 2 != 0)
    fail(m.head_dim > 0 ? "model.head_dim" : "model.heads",
         std::string("the rotary positions need an even head size; ") +
             (m.head_dim > 0 ? "model.head_dim is " : "model.d_model / model.heads = ") + num(size));
  if (is("model.rope_scaling", m.rope_scaling, RopeScaling::Llama3)) rope_llama3();
  placeholders("lora.init_from", j_.lora.init_from, true);
  per_task_dir("lora.init_from", j_.lora.init_from);
  export_section();
  if (!j_.lora.init_from.empty() && !llama && ok("model.arch"))
    fail("lora.init_from", "reads PEFT adapters, which are for the Hugging Face layouts (model.arch llama, mistral, qwen2 "
                           "or qwen3)", "model.arch");
}

// rope_scaling llama3's numbers, as Hugging Face requires them (its smoothing divides by
// high_freq_factor - low_freq_factor).
void Checker::rope_llama3() {
  const ModelConfig& m = j_.model;
  for (const auto& [key, v] : {std::pair<const char*, double>{"model.rope_factor", m.rope_factor},
                               {"model.rope_low_freq_factor", m.rope_low_freq_factor},
                               {"model.rope_high_freq_factor", m.rope_high_freq_factor}})
    if (!(v > 0) || !std::isfinite(v)) fail(key, "must be a finite number > 0, got " + num(v));
  if (std::isfinite(m.rope_high_freq_factor) && !(m.rope_high_freq_factor > m.rope_low_freq_factor))
    fail("model.rope_high_freq_factor", "must be above model.rope_low_freq_factor (" + num(m.rope_low_freq_factor) +
                                            "), got " + num(m.rope_high_freq_factor));
  at_least<int64_t>("model.rope_original_max_positions", m.rope_original_max_positions, 1);
}

// The built-in models' parameter shapes follow from the model keys (daemon/models/models.cpp
// builds them): the largest parameter and the total are bounded before anything is allocated.
// Skipped while a key it reads is out of its own range (that is reported already).
void Checker::model_size() {
  const ModelConfig& m = j_.model;
  for (const char* key : {"model.input_dim", "model.hidden", "model.output_dim", "model.trunk_layers",
                          "model.head_layers", "model.tasks", "model.adapter_rank", "model.classes",
                          "offload.shard_mb"})
    if (!ok(key)) return;
  auto in = [](int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
  if (!in(m.input_dim, 1, kMaxDim) || !in(m.hidden, 1, kMaxDim) || !in(m.output_dim, 1, kMaxDim) ||
      !in(m.trunk_layers, 0, kMaxLayers) || !in(m.head_layers, 1, kMaxLayers) || !in(m.tasks, 1, kMaxTasks))
    return;
  if (m.kind == ModelKind::MultitaskAdapter && !in(m.adapter_rank, 1, kMaxDim)) return;
  if (m.kind == ModelKind::ExtremeClassifier && !in(m.classes, m.tasks, int64_t{1} << 32)) return;

  // The largest parameter: its description, its two dimensions and the keys they come from.
  struct Largest {
    double elems = 0;
    std::string what, rkey, ckey;
    int64_t rows = 0, cols = 0;
  } big;
  auto matrix = [&](const std::string& what, int64_t rows, const char* rkey, int64_t cols, const char* ckey) {
    const double e = double(rows) * double(cols);
    if (e > big.elems) big = {e, what, rkey, ckey, rows, cols};
    return e;
  };
  const double H = double(m.hidden);
  // `n` more hidden x hidden layers with their biases (none: nothing is counted).
  auto square_layers = [&](int64_t n, const std::string& what) {
    return n > 0 ? double(n) * (matrix(what, m.hidden, "model.hidden", m.hidden, "model.hidden") + H) : 0.0;
  };
  double shared = 0, per_task = 0;  // elements of Θ and of one θ[t] (the largest slice)
  std::string per_task_keys;
  if (m.kind == ModelKind::MultitaskMlp) {
    if (m.trunk_layers >= 1)
      shared = matrix("trunk.0.weight", m.hidden, "model.hidden", m.input_dim, "model.input_dim") + H +
               square_layers(m.trunk_layers - 1, "trunk.<i>.weight");
    const bool trunk = m.trunk_layers >= 1;
    const int64_t dim = trunk ? m.hidden : m.input_dim;
    const char* dim_key = trunk ? "model.hidden" : "model.input_dim";
    if (m.head_layers == 1) {
      per_task = matrix("heads.<t>.0.weight", m.output_dim, "model.output_dim", dim, dim_key) + double(m.output_dim);
    } else {
      per_task = matrix("heads.<t>.0.weight", m.hidden, "model.hidden", dim, dim_key) + H +
                 square_layers(m.head_layers - 2, "heads.<t>.<i>.weight") +
                 matrix("heads.<t>.<last>.weight", m.output_dim, "model.output_dim", m.hidden, "model.hidden") +
                 double(m.output_dim);
    }
    per_task_keys = "model.head_layers";
  } else if (m.kind == ModelKind::MultitaskAdapter) {
    const double blocks = double(std::max<int64_t>(m.trunk_layers, 1));
    shared = matrix("embed.weight", m.hidden, "model.hidden", m.input_dim, "model.input_dim") + H +
             square_layers(2 * std::max<int64_t>(m.trunk_layers, 1), "blocks.<i>.fc1.weight");
    per_task = 2 * blocks * matrix("adapters.<t>.<i>.down", m.adapter_rank, "model.adapter_rank", m.hidden, "model.hidden") +
               matrix("heads.<t>.weight", m.output_dim, "model.output_dim", m.hidden, "model.hidden") +
               double(m.output_dim);
    per_task_keys = "model.adapter_rank";
  } else if (m.kind == ModelKind::ExtremeClassifier) {
    shared = matrix("encoder.0.weight", m.hidden, "model.hidden", m.input_dim, "model.input_dim") + H +
             square_layers(std::max<int64_t>(m.trunk_layers, 1) - 1, "encoder.<i>.weight");
    const int64_t rows = m.classes / m.tasks + (m.classes % m.tasks ? 1 : 0);  // the largest slice
    const bool sharded = j_.offload.shard_mb > 0;
    matrix(sharded ? "output.<t>.weight_bias" : "output.<t>.weight", rows, "model.classes",
           sharded ? m.hidden + 1 : m.hidden, "model.hidden");
    per_task = double(rows) * (H + 1);
    per_task_keys = "model.classes";
  }
  if (big.elems > kMaxTensorElems) {
    // At the key of the parameter's dimensions that the file gives (else the section's line).
    const std::string key = culprit({big.rkey.c_str(), big.ckey.c_str()});
    fail(key, "the largest parameter of " + to_string(m.kind) + ", " + big.what + " [" + big.rkey +
                  " x " + big.ckey + " = " + num(big.rows) + " x " + num(big.cols) + "], has " +
                  num(big.elems) + " elements (" + fp32_size(big.elems) + "); a parameter may have at most 2^34 = " +
                  num(kMaxTensorElems) + " elements (" + fp32_size(kMaxTensorElems) + ")",
         "model");
    return;
  }
  // The extreme classifier's slices add up to classes rows, not tasks x the largest.
  const double tasks_total = m.kind == ModelKind::ExtremeClassifier ? double(m.classes) * (H + 1)
                                                                    : double(m.tasks) * per_task;
  const double total = shared + tasks_total;
  offload_sizes(shared, per_task, tasks_total);
  if (total > kMaxModelParams) {
    const std::string key = m.kind == ModelKind::ExtremeClassifier
                                ? culprit({"model.classes", "model.hidden"})
                                : culprit({"model.tasks", "model.hidden", "model.input_dim", "model.output_dim",
                                           "model.trunk_layers", per_task_keys.c_str()});
    const std::string tasks_part = m.kind == ModelKind::ExtremeClassifier
        ? "model.classes x (model.hidden + 1) = " + num(m.classes) + " x " + num(m.hidden + 1)
        : "model.tasks (" + num(m.tasks) + ") x " + num(per_task) + " per task";
    fail(key, "the parameters of " + to_string(m.kind) + " add up to " + num(total) + " elements (" +
                  fp32_size(total) + "): " + num(shared) + " shared + " + tasks_part +
                  " (model.input_dim, model.hidden, model.output_dim, model.trunk_layers, " + per_task_keys +
                  "); a model may have at most 2^38 = " + num(kMaxModelParams) + " parameters (" +
                  fp32_size(kMaxModelParams) + ")",
         "model");
  }
}

void Checker::torchscript() {
  const ModelConfig& m = j_.model;
  // A TorchScript file is a program: its forward may call builtins that read, create and overwrite
  // files (torch.from_file(path, True, n)), with the rights of whoever runs thetad.
  if (!m.trust_code && ok("model.trust_code"))
    fail("model.trust_code", "model.kind torchscript runs the code of model.path" +
                                 (m.path.empty() ? std::string() : " ('" + m.path + "')") +
                                 " with your rights: its forward can read, write and delete your files. Set "
                                 "model.trust_code: true if you trust the file and whoever made it",
         "model.kind");
  if (m.path.empty()) {
    fail("model.path", "torchscript needs the path of the exported model file", "model.kind");
  } else if (ok("model.path") && m.path.find("{rank}") == std::string::npos) {
    placeholders("model.path", m.path);
    const std::string p = with_job(m.path);
    std::error_code ec;
    if (!std::filesystem::is_regular_file(p, ec))
      fail("model.path", "no such file: '" + p + "' (relative paths are resolved against the "
                         "current directory)");
  }
  if (m.shared.empty())
    fail("model.shared", "torchscript needs name patterns of the shared parameters, e.g. "
                         "[\"trunk.*\"]", "model.kind");
  for (size_t i = 0; i < m.shared.size(); ++i)
    if (m.shared[i].empty())
      fail("model.shared[" + std::to_string(i) + "]", "empty pattern");
  if (m.task.empty())
    fail("model.task", "torchscript needs the name pattern(s) of the per-task parameters, e.g. "
                       "\"heads.{t}.*\" or [\"adapters.{t}.*\", \"heads.{t}.*\"]", "model.kind");
  for (size_t i = 0; i < m.task.size(); ++i) {
    const std::string key = m.task.size() == 1 ? "model.task" : "model.task[" + std::to_string(i) + "]";
    if (m.task[i].find("{t}") == std::string::npos)
      fail(key, "pattern must contain {t} (the task index 0..T-1); got '" + m.task[i] + "'");
  }
}

}  // namespace thetad::config::detail
