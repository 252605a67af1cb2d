// Keys without effect under the job's choices (see relevance.hpp).
#include "config/relevance.hpp"

#include <string>
#include <vector>

namespace thetad::config::detail {
namespace {

struct Rule {
  const char* key;  // key path
  bool used;        // whether it has an effect in this job
  std::string why;  // what would make it matter
};

}  // namespace

void warn_irrelevant(const Job& job, Diagnostics& diag) {
  const ModelKind mk = job.model.kind;
  const ScheduleKind sk = job.data.schedule;
  const std::string model = "model.kind is " + to_string(mk);
  const std::string sched = "data.schedule is " + to_string(sk);
  const bool mlp_like = mk == ModelKind::MultitaskMlp || mk == ModelKind::MultitaskAdapter;
  const bool transformer = mk == ModelKind::Transformer;
  const bool stream = job.offload.shared == SharedMode::Stream;
  const bool layer_slots = stream || (transformer && job.model.base_shard == BaseShard::Node);
  const bool token_model = transformer || job.data.kind == DataKind::Tokens;
  const bool llama = transformer && llama_family(job.model.arch);
  const bool llama3 = llama && job.model.rope_scaling == RopeScaling::Llama3;
  const bool merged = !job.export_.merged_dir.empty();
  const std::vector<Rule> rules = {
      {"model.adapter_rank", mk == ModelKind::MultitaskAdapter, model + " (used by multitask_adapter)"},
      {"model.classes", mk == ModelKind::ExtremeClassifier, model + " (used by extreme_classifier)"},
      {"model.negatives_per_step", mk == ModelKind::ExtremeClassifier, model + " (used by extreme_classifier)"},
      {"model.output_dim", mlp_like || (mk == ModelKind::Torchscript && job.data.kind != DataKind::Tokens),
       model + " (used by multitask_mlp, multitask_adapter, and torchscript on synthetic or npy data)"},
      {"model.path", mk == ModelKind::Torchscript, model + " (used by torchscript)"},
      {"model.trust_code", mk == ModelKind::Torchscript, model + " (used by torchscript)"},
      {"model.shared", mk == ModelKind::Torchscript, model + " (used by torchscript)"},
      {"model.task", mk == ModelKind::Torchscript, model + " (used by torchscript)"},
      {"model.trunk_layers", mlp_like || mk == ModelKind::ExtremeClassifier, model + " (used by multitask_mlp, multitask_adapter and extreme_classifier)"},
      {"model.head_layers", mk == ModelKind::MultitaskMlp, model + " (used by multitask_mlp)"},
      {"model.hidden", mk != ModelKind::Torchscript && !transformer, model + " (the transformer's width is model.d_model)"},
      {"model.input_dim", !transformer, model + " (the transformer reads token ids)"},
      {"model.layers", transformer, model + " (used by transformer)"},
      {"model.d_model", transformer, model + " (used by transformer)"},
      {"model.heads", transformer, model + " (used by transformer)"},
      {"model.d_ff", transformer, model + " (used by transformer)"},
      {"model.vocab", token_model, model + " and data.kind is " + to_string(job.data.kind) + " (used by transformer and token data)"},
      {"model.seq_len", token_model, model + " and data.kind is " + to_string(job.data.kind) + " (used by transformer and token data)"},
      {"lora.rank", transformer, model + " (LoRA adapters are the transformer's)"},
      {"lora.alpha", transformer, model + " (LoRA adapters are the transformer's)"},
      {"lora.targets", transformer, model + " (LoRA adapters are the transformer's)"},
      {"model.arch", transformer, model + " (used by transformer)"},
      {"model.norm_eps", transformer, model + " (used by transformer)"},
      {"model.tie_embeddings", transformer, model + " (used by transformer)"},
      {"model.base_quant", transformer, model + " (used by transformer)"},
      {"model.base_shard", transformer, model + " (used by transformer)"},
      {"model.kv_heads", llama, "model.arch is gpt2 (used by the llama family)"},
      {"model.rope_theta", llama, "model.arch is gpt2 (used by the llama family)"},
      {"model.head_dim", llama, "model.arch is gpt2 (used by the llama family)"},
      {"model.rope_scaling", llama, "model.arch is gpt2 (used by the llama family)"},
      {"model.rope_factor", llama3, "model.rope_scaling is not llama3"},
      {"model.rope_low_freq_factor", llama3, "model.rope_scaling is not llama3"},
      {"model.rope_high_freq_factor", llama3, "model.rope_scaling is not llama3"},
      {"model.rope_original_max_positions", llama3, "model.rope_scaling is not llama3"},
      {"lora.init_from", transformer, model + " (LoRA adapters are the transformer's)"},
      {"export.adapters_dir", transformer, model + " (LoRA adapters are the transformer's)"},
      {"export.base_model", !job.export_.adapters_dir.empty(), "export.adapters_dir is empty (no export)"},
      {"export.at_checkpoints", !job.export_.adapters_dir.empty(), "export.adapters_dir is empty (no export)"},
      {"export.merged_dir", transformer, model + " (merged models are the transformer's)"},
      {"export.dtype", job.export_.any(), "export.adapters_dir and export.merged_dir are empty (no export)"},
      {"export.max_shard_mb", merged, "export.merged_dir is empty (no merged model)"},
      {"data.token_dtype", job.data.kind == DataKind::Tokens || !job.eval.dir.empty(),
       "data.kind is " + to_string(job.data.kind) + " and there is no eval.dir (used by token files)"},
      {"eval.every_steps", !job.eval.dir.empty(), "eval.dir is empty (no evaluation)"},
      {"eval.rows", !job.eval.dir.empty(), "eval.dir is empty (no evaluation)"},
      {"eval.tasks", !job.eval.dir.empty(), "eval.dir is empty (no evaluation)"},
      {"export.best", !job.export_.adapters_dir.empty(), "export.adapters_dir is empty (no export)"},
      {"data.dir", job.data.kind == DataKind::Npy || job.data.kind == DataKind::Tokens,
       "data.kind is " + to_string(job.data.kind) + " (used by npy and tokens)"},
      {"data.noise", job.data.kind == DataKind::Synthetic, "data.kind is " + to_string(job.data.kind) + " (used by synthetic)"},
      {"data.tasks_per_rank", sk == ScheduleKind::RoundRobin || sk == ScheduleKind::Weighted,
       sched + " (used by round_robin and weighted)"},
      {"data.weights", sk == ScheduleKind::Weighted, sched + " (used by weighted)"},
      {"data.per_rank", sk == ScheduleKind::PerRank, sched + " (used by per_rank)"},
      {"data.alternate", sk == ScheduleKind::Alternate, sched + " (used by alternate)"},
      {"offload.device_slots", job.offload.enabled, "offload.enabled is false"},
      {"offload.device_budget_mb", job.offload.enabled, "offload.enabled is false"},
      {"offload.device_cache_mb", job.offload.enabled, "offload.enabled is false"},
      {"offload.host_groups", job.offload.enabled, "offload.enabled is false"},
      {"offload.uncached_update", job.offload.enabled, "offload.enabled is false"},
      {"offload.prefetch", job.offload.enabled, "offload.enabled is false"},
      // Θ's host store (offload.shared: stream) has the same host limit and CPU Adam threads.
      {"offload.host_limit_mb", job.offload.enabled || stream, "offload.enabled is false and offload.shared is resident"},
      {"offload.cpu_threads", job.offload.enabled || stream, "offload.enabled is false and offload.shared is resident"},
      {"offload.shared_prefetch_layers", layer_slots, "offload.shared is resident and model.base_shard none"},
      {"offload.shared_device_layers", stream, "offload.shared is resident"},
      {"offload.shared_split_layers", stream, "offload.shared is resident"},
      {"offload.h2d_dtype", job.offload.enabled || stream, "offload.enabled is false and offload.shared is resident"},
      {"checkpoint.async", !job.checkpoint.dir.empty(), "checkpoint.dir is empty (no checkpoints)"},
      {"optimizer.betas", job.optimizer.kind != OptimizerKind::Sgd, "optimizer.kind is sgd"},
      {"optimizer.eps", job.optimizer.kind != OptimizerKind::Sgd, "optimizer.kind is sgd"},
      {"optimizer.min_lr", job.optimizer.lr_schedule == LrSchedule::Cosine, "optimizer.lr_schedule is not cosine"},
  };
  for (const Rule& r : rules)
    if (!r.used && diag.given(r.key) && !diag.bad(r.key)) diag.warning(r.key, "ignored: " + r.why);
}

}  // namespace thetad::config::detail
