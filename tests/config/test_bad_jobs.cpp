// The table of bad job files: each must be rejected with a JobError whose message names the
// file, the line (and column) and the key path. Line numbers are 1-based, as editors show them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/loader.hpp"

namespace thetad::config {
namespace {

// Three valid lines; rows append to it, so their own lines start at line 4.
const std::string kHead =
    "steps: 10\n"
    "model: {kind: multitask_mlp, tasks: 4}\n"
    "data: {kind: synthetic}\n";

struct BadJob {
  const char* name;
  std::string yaml;
  std::vector<std::string> expect;  // substrings of the message
};

const std::vector<BadJob>& bad_jobs() {
  static const std::vector<BadJob> rows = {
      // Documents that are not job files at all.
      {"malformed_flow", "steps: 10\nmodel: {kind: multitask_mlp\ndata: {}\n",
       {"bad.yaml:", "malformed YAML"}},
      {"malformed_mapping", "steps: 10\nmodel: a: b\n", {"bad.yaml:2:", "malformed YAML"}},
      {"top_level_list", "- steps: 10\n", {"bad.yaml:1:1:", "must be a map"}},
      {"top_level_scalar", "hello\n", {"bad.yaml:1:1:", "must be a map", "'hello'"}},
      {"two_documents", kHead + "---\nsteps: 3\n", {"bad.yaml:4:", "one YAML document"}},  // the --- line
      {"non_scalar_key", kHead + "? [a, b]\n: 1\n", {"bad.yaml:4:", "plain names"}},
      // Required keys and sections.
      {"missing_steps", "model: {kind: multitask_mlp}\ndata: {}\n",
       {"bad.yaml:1:1: steps: required key is missing"}},
      {"missing_model", "steps: 10\ndata: {}\n", {"bad.yaml:", "model: required section"}},
      {"missing_data", "steps: 10\nmodel: {kind: multitask_mlp}\n",
       {"bad.yaml:", "data: required section"}},
      {"missing_model_kind", "steps: 10\nmodel:\n  tasks: 4\ndata: {}\n",
       {"bad.yaml:2:1: model.kind: required key is missing", "multitask_mlp"}},
      // Unknown keys.
      {"unknown_top_key", "stpes: 10\nmodel: {kind: multitask_mlp}\ndata: {}\n",
       {"bad.yaml:1:1: stpes: unknown key; did you mean 'steps'?"}},
      {"unknown_section_key", kHead + "optimizer:\n  lrr: 0.1\n",
       {"bad.yaml:5:3: optimizer.lrr: unknown key; did you mean 'lr'?"}},
      {"key_in_wrong_section", kHead + "lr: 0.1\n",
       {"bad.yaml:4:1: lr: unknown key; did you mean 'optimizer.lr'?"}},
      {"unknown_section", kHead + "optimiser: {lr: 0.1}\n",
       {"bad.yaml:4:1: optimiser:", "did you mean 'optimizer'?"}},
      {"unknown_key_flow_map", "steps: 10\nmodel: {kind: multitask_mlp, taks: 4}\ndata: {}\n",
       {"bad.yaml:2:30: model.taks:", "did you mean 'tasks'?"}},
      {"duplicate_key", kHead + "steps: 20\n", {"bad.yaml:4:1: steps: duplicate key", "line 1"}},
      // Wrong types.
      {"string_for_int", "steps: ten\nmodel: {kind: multitask_mlp}\ndata: {}\n",
       {"bad.yaml:1:1: steps: expected an integer, got 'ten'"}},
      {"quoted_number", "steps: \"10\"\nmodel: {kind: multitask_mlp}\ndata: {}\n",
       {"bad.yaml:1:1: steps: expected an integer, got the string \"10\""}},
      {"tagged_string_for_int", "steps: !!str 5\nmodel: {kind: multitask_mlp}\ndata: {}\n",
       {"bad.yaml:1:1: steps: expected an integer, got the string \"5\""}},
      {"fraction_for_int", "steps: 2.5\nmodel: {kind: multitask_mlp}\ndata: {}\n",
       {"bad.yaml:1:1: steps:", "expected an integer"}},
      {"int_out_of_range", "steps: 99999999999999999999\nmodel: {kind: multitask_mlp}\ndata: {}\n",
       {"bad.yaml:1:1: steps:", "out of range"}},
      {"list_for_map", kHead + "comm: [mpi]\n", {"bad.yaml:4:1: comm: expected a map"}},
      // Impossible sizes: named with file, line and key before anything is allocated.
      {"huge_hidden", "steps: 10\nmodel: {kind: multitask_mlp, hidden: 9223372036854775807}\ndata: {}\n",
       {"bad.yaml:2:", "model.hidden: must be <= 16777216"}},
      {"huge_batch", "steps: 10\nmodel: {kind: multitask_mlp}\ndata: {batch_per_rank: 100000000000}\n",
       {"bad.yaml:3:", "data.batch_per_rank: must be <= 16777216"}},
      {"too_many_tasks", "steps: 10\nmodel: {kind: multitask_mlp, tasks: 3000000000}\ndata: {}\n",
       {"bad.yaml:2:", "model.tasks: must be <= 1048576"}},
      {"huge_timeout", kHead + "comm: {timeout_s: 1.0e+17}\n", {"bad.yaml:4:", "comm.timeout_s: must be <= 10000000"}},
      // Found by fuzz_job_config: a size beyond size_t's range reached the bucket floor's MiB ->
      // bytes conversion (undefined); it saturates and the range check names the key.
      {"bucket_cap_beyond_size_t", kHead + "comm: {bucket_cap_mb: 2.6e+38}\n", {"bad.yaml:4:", "comm.bucket_cap_mb: must be <="}},
      {"huge_shard", kHead + "offload: {shard_mb: 1.0e+300}\n", {"bad.yaml:4:", "offload.shard_mb: must be <="}},
      {"offload_sgd", kHead + "offload: {enabled: true}\noptimizer: {kind: sgd}\n",
       {"bad.yaml:4:", "offload.enabled: the host store steps Adam/AdamW only"}},
      {"scalar_for_section", "steps: 10\nmodel: 5\ndata: {}\n",
       {"bad.yaml:2:1: model: expected a map", "'5'"}},
      {"map_for_number", kHead + "optimizer:\n  lr: {a: 1}\n",
       {"bad.yaml:5:3: optimizer.lr: expected a number, got a map"}},
      {"nan_for_number", kHead + "optimizer: {lr: .nan}\n",
       {"bad.yaml:4:13: optimizer.lr:", "expected a number"}},
      {"yes_for_bool", kHead + "comm:\n  prune: yes\n",
       {"bad.yaml:5:3: comm.prune: expected true or false, got 'yes'"}},
      {"scalar_for_list", "steps: 10\nmodel: {kind: multitask_mlp}\ndata:\n  weights: 1\n",
       {"bad.yaml:4:3: data.weights: expected a list of numbers, got '1'"}},
      {"weights_element_string",
       "steps: 10\nmodel: {kind: multitask_mlp, tasks: 2}\ndata:\n  schedule: weighted\n"
       "  weights: [1, heavy]\n",
       {"bad.yaml:5:16: data.weights[1]: expected a number, got 'heavy'"}},
      {"empty_file", "", {"bad.yaml:1:1: steps: required key is missing"}},
      {"comment_only_file", "# nothing here\n", {"bad.yaml:1:1: model: required section"}},
      {"seed_negative", kHead + "seed: -1\n", {"bad.yaml:4:1: seed: must be >= 0"}},
      // Out of range.
      {"steps_zero", "steps: 0\nmodel: {kind: multitask_mlp}\ndata: {}\n",
       {"bad.yaml:1:1: steps: must be > 0, got 0"}},
      {"tasks_zero", "steps: 10\nmodel:\n  kind: multitask_mlp\n  tasks: 0\ndata: {}\n",
       {"bad.yaml:4:3: model.tasks: must be > 0, got 0"}},
      {"input_dim_negative", "steps: 10\nmodel:\n  kind: multitask_mlp\n  input_dim: -1\ndata: {}\n",
       {"bad.yaml:4:3: model.input_dim: must be > 0, got -1"}},
      {"hidden_zero", "steps: 10\nmodel:\n  kind: multitask_mlp\n  hidden: 0\ndata: {}\n",
       {"bad.yaml:4:3: model.hidden: must be > 0"}},
      {"output_dim_negative", "steps: 10\nmodel:\n  kind: multitask_mlp\n  output_dim: -3\ndata: {}\n",
       {"bad.yaml:4:3: model.output_dim: must be > 0, got -3"}},
      {"trunk_layers_negative",
       "steps: 10\nmodel:\n  kind: multitask_mlp\n  trunk_layers: -1\ndata: {}\n",
       {"bad.yaml:4:3: model.trunk_layers: must be >= 0"}},
      {"head_layers_zero", "steps: 10\nmodel:\n  kind: multitask_mlp\n  head_layers: 0\ndata: {}\n",
       {"bad.yaml:4:3: model.head_layers: must be >= 1"}},
      {"batch_zero", "steps: 10\nmodel: {kind: multitask_mlp}\ndata:\n  batch_per_rank: 0\n",
       {"bad.yaml:4:3: data.batch_per_rank: must be > 0"}},
      {"bucket_cap_zero", kHead + "comm:\n  bucket_cap_mb: 0\n",
       {"bad.yaml:5:3: comm.bucket_cap_mb: must be > 0"}},
      {"first_bucket_zero", kHead + "comm:\n  first_bucket_mb: 0\n",
       {"bad.yaml:5:3: comm.first_bucket_mb: must be > 0"}},
      {"first_bucket_above_cap", kHead + "comm:\n  bucket_cap_mb: 4\n  first_bucket_mb: 8\n",
       {"bad.yaml:6:3: comm.first_bucket_mb:", "must be <= comm.bucket_cap_mb (4)"}},
      {"timeout_zero", kHead + "comm:\n  timeout_s: 0\n", {"bad.yaml:5:3: comm.timeout_s: must be >= 1 s"}},
      // Input files validate can see: run would refuse them on every rank.
      {"tokens_dir_missing", "steps: 10\nmodel: {kind: transformer, tasks: 2}\ndata: {kind: tokens, dir: /nonexistent-thetad-dir}\n",
       {"bad.yaml:3:", "data.dir: '/nonexistent-thetad-dir' is not a directory (no such directory)"}},
      {"npy_dir_missing", "steps: 10\nmodel: {kind: multitask_mlp, tasks: 2}\ndata: {kind: npy, dir: \"/nonexistent-{job}\"}\n",
       {"bad.yaml:3:", "data.dir: '/nonexistent-thetad-job' is not a directory"}},
      {"npy_dir_not_dir", "steps: 10\nmodel: {kind: multitask_mlp, tasks: 2}\ndata: {kind: npy, dir: /dev/null}\n",
       {"bad.yaml:3:", "data.dir: '/dev/null' is not a directory"}},
      {"cache_holds_no_group",
       "steps: 10\nmodel: {kind: multitask_mlp, tasks: 4, hidden: 1024, output_dim: 1024}\ndata: {}\n"
       "offload: {enabled: true, device_cache_mb: 1}\n",
       {"bad.yaml:4:", "offload.device_cache_mb: 1 MiB holds no task group", "1049600 parameters x 12 bytes"}},
      {"host_limit_below_arena",
       "steps: 10\nmodel: {kind: multitask_mlp, tasks: 4, hidden: 1024, output_dim: 1024}\ndata: {}\n"
       "offload: {enabled: true, host_limit_mb: 1}\n",
       {"bad.yaml:4:", "offload.host_limit_mb: is 1 MiB but the host arena of the task groups needs at least"}},
      {"timeout_tiny", kHead + "comm: {timeout_s: 1.0e-9}\n", {"bad.yaml:4:", "comm.timeout_s: must be >= 1 s", "got 1.0e-09"}},
      {"timeout_half", kHead + "comm: {timeout_s: 0.5}\n", {"bad.yaml:4:", "comm.timeout_s: must be >= 1 s"}},
      {"beta_one", kHead + "optimizer:\n  betas: [0.9, 1.0]\n",
       {"bad.yaml:5:16: optimizer.betas[1]: beta2 must be in [0, 1), got 1"}},
      {"beta_negative", kHead + "optimizer:\n  betas: [-0.1, 0.9]\n",
       {"bad.yaml:5:11: optimizer.betas[0]: beta1 must be in [0, 1)"}},
      {"betas_three", kHead + "optimizer:\n  betas: [0.9, 0.99, 0.999]\n",
       {"bad.yaml:5:3: optimizer.betas: expected a list of 2 numbers", "3 elements"}},
      {"lr_zero", kHead + "optimizer:\n  lr: 0\n", {"bad.yaml:5:3: optimizer.lr: must be > 0"}},
      {"eps_zero", kHead + "optimizer:\n  eps: 0\n", {"bad.yaml:5:3: optimizer.eps: must be > 0"}},
      {"weight_decay_negative", kHead + "optimizer:\n  weight_decay: -0.1\n",
       {"bad.yaml:5:3: optimizer.weight_decay: must be >= 0, got -0.1"}},
      {"clip_norm_negative", kHead + "optimizer:\n  clip_norm: -1\n",
       {"bad.yaml:5:3: optimizer.clip_norm: must be >= 0"}},
      {"warmup_negative", kHead + "optimizer:\n  warmup_steps: -5\n",
       {"bad.yaml:5:3: optimizer.warmup_steps: must be >= 0"}},
      {"min_lr_above_lr", kHead + "optimizer:\n  lr: 0.001\n  min_lr: 0.01\n",
       {"bad.yaml:6:3: optimizer.min_lr: must be <= optimizer.lr"}},
      {"device_slots_zero", kHead + "offload:\n  enabled: true\n  device_slots: 0\n",
       {"bad.yaml:6:3: offload.device_slots: must be >= 1"}},
      {"prefetch_negative", kHead + "offload:\n  prefetch: -1\n",
       {"bad.yaml:5:3: offload.prefetch: must be >= 0"}},
      {"cpu_threads_negative", kHead + "offload:\n  cpu_threads: -2\n",
       {"bad.yaml:5:3: offload.cpu_threads: must be >= 0"}},
      {"shard_negative", kHead + "offload:\n  shard_mb: -1\n", {"bad.yaml:5:3: offload.shard_mb: must be >= 0"}},
      {"shard_on_mlp", kHead + "offload:\n  enabled: true\n  shard_mb: 8\n",
       {"bad.yaml:6:3: offload.shard_mb: row shards are computed by model.kind extreme_classifier only",
        "'multitask_mlp'"}},
      {"shard_below_row",
       "steps: 10\nmodel: {kind: extreme_classifier, classes: 100, hidden: 128}\ndata: {}\n"
       "offload:\n  shard_mb: 0.0001\n",
       {"bad.yaml:5:3: offload.shard_mb: must hold one row of the output layer", "516 bytes"}},
      {"budget_negative", kHead + "offload:\n  enabled: true\n  device_budget_mb: -1\n",
       {"bad.yaml:6:3: offload.device_budget_mb: must be >= 0"}},
      {"keep_zero", kHead + "checkpoint:\n  dir: ck\n  keep: 0\n", {"bad.yaml:6:3: checkpoint.keep: must be >= 1"}},
      {"every_steps_negative", kHead + "checkpoint:\n  dir: ck\n  every_steps: -1\n",
       {"bad.yaml:6:3: checkpoint.every_steps: must be >= 0"}},
      {"accumulate_zero", kHead + "accumulate_steps: 0\n", {"bad.yaml:4:1: accumulate_steps: must be >= 1"}},
      {"tasks_per_rank_above_tasks",
       "steps: 10\nmodel: {kind: multitask_mlp, tasks: 2}\ndata:\n  tasks_per_rank: 3\n",
       {"bad.yaml:4:3: data.tasks_per_rank: must be <= model.tasks (2), got 3"}},
      {"tasks_per_rank_zero", "steps: 10\nmodel: {kind: multitask_mlp}\ndata:\n  tasks_per_rank: 0\n",
       {"bad.yaml:4:3: data.tasks_per_rank: must be >= 1"}},
      {"progress_negative", kHead + "log:\n  progress_every_s: -1\n",
       {"bad.yaml:5:3: log.progress_every_s: must be >= 0"}},
      // Enum values.
      {"model_kind_typo", "steps: 10\nmodel:\n  kind: multitask_mpl\ndata: {}\n",
       {"bad.yaml:3:3: model.kind: must be one of multitask_mlp, multitask_adapter",
        "did you mean 'multitask_mlp'?"}},
      {"data_kind_bad", "steps: 10\nmodel: {kind: multitask_mlp}\ndata:\n  kind: csv\n",
       {"bad.yaml:4:3: data.kind: must be one of synthetic, npy, tokens; got 'csv'"}},
      {"schedule_bad", "steps: 10\nmodel: {kind: multitask_mlp}\ndata:\n  schedule: random\n",
       {"bad.yaml:4:3: data.schedule: must be one of round_robin, weighted, per_rank, all, alternate"}},
      {"backend_bad", kHead + "comm:\n  backend: gloo\n", {"bad.yaml:5:3: comm.backend: must be one of auto, mpi, nccl"}},
      {"average_bad", kHead + "comm:\n  average: mean\n", {"bad.yaml:5:3: comm.average: must be one of contributors, world"}},
      {"active_bad", kHead + "comm:\n  active: find\n", {"bad.yaml:5:3: comm.active: must be one of declared, discover"}},
      {"optimizer_kind_bad", kHead + "optimizer:\n  kind: lamb\n", {"bad.yaml:5:3: optimizer.kind: must be one of adamw, adam, sgd"}},
      {"lr_schedule_bad", kHead + "optimizer:\n  lr_schedule: linear\n",
       {"bad.yaml:5:3: optimizer.lr_schedule: must be one of constant, cosine"}},
      {"log_level_bad", kHead + "log:\n  level: verbose\n", {"bad.yaml:5:3: log.level: must be one of trace, debug"}},
      {"precision_bad", kHead + "precision: fp16\n", {"bad.yaml:4:1: precision: must be one of fp32, tf32, bf16; got 'fp16'"}},
      {"grad_dtype_bad", kHead + "comm: {grad_dtype: fp16}\n", {"bad.yaml:4:", "comm.grad_dtype: must be one of fp32, bf16; got 'fp16'"}},
      {"h2d_dtype_bad", kHead + "offload: {enabled: true, h2d_dtype: fp16}\n",
       {"bad.yaml:4:", "offload.h2d_dtype: must be one of fp32, bf16; got 'fp16'"}},
      {"uncached_update_bad", kHead + "offload: {enabled: true, uncached_update: gpu}\n",
       {"bad.yaml:4:", "offload.uncached_update: must be one of auto, host, device; got 'gpu'"}},
      {"h2d_bf16_with_fp32", kHead + "offload:\n  enabled: true\n  h2d_dtype: bf16\n",
       {"bad.yaml:6:3: offload.h2d_dtype: bf16 copies are for precision: bf16", "precision is fp32"}},
      // The transformer and its LoRA adapters.
      {"transformer_heads", "steps: 1\nmodel: {kind: transformer, d_model: 10, heads: 4}\ndata: {}\n",
       {"bad.yaml:2:", "model.heads: must divide model.d_model (10) into equal heads, got 4"}},
      {"lora_target_unknown", "steps: 1\nmodel: {kind: transformer}\nlora: {targets: [q, gates]}\ndata: {}\n",
       {"bad.yaml:3:", "lora.targets[1]: must be one of q, k, v, o, gate, up, down; got 'gates'"}},
      // The llama architecture, PEFT adapters and token files.
      {"lora_gate_gpt2", "steps: 1\nmodel: {kind: transformer}\nlora: {targets: [q, gate]}\ndata: {}\n",
       {"bad.yaml:3:", "lora.targets[1]: 'gate' is the llama MLP's gate; model.arch is gpt2"}},
      {"llama_kv_heads", "steps: 1\nmodel: {kind: transformer, arch: llama, heads: 4, kv_heads: 3}\ndata: {}\n",
       {"bad.yaml:2:", "model.kv_heads: must divide model.heads (4) into equal groups, got 3"}},
      {"llama_odd_head", "steps: 1\nmodel: {kind: transformer, arch: llama, d_model: 12, heads: 4}\ndata: {}\n",
       {"bad.yaml:2:", "model.heads: the rotary positions need an even head size; model.d_model / model.heads = 3"}},
      {"llama_rope_theta", "steps: 1\nmodel: {kind: transformer, arch: llama, rope_theta: 0}\ndata: {}\n",
       {"bad.yaml:2:", "model.rope_theta: must be a finite number > 0, got 0"}},
      {"model_arch_unknown", "steps: 1\nmodel: {kind: transformer, arch: gemma}\ndata: {}\n",
       {"bad.yaml:2:", "model.arch: must be one of gpt2, llama, mistral, qwen2, qwen3; got 'gemma'"}},
      {"export_without_task", "steps: 1\nmodel: {kind: transformer, arch: llama, tasks: 2}\ndata: {}\nexport: {adapters_dir: out}\n",
       {"bad.yaml:4:", "export.adapters_dir: has no {task} but model.tasks is 2"}},
      {"export_gpt2", "steps: 1\nmodel: {kind: transformer, tasks: 1}\ndata: {}\nexport: {adapters_dir: out}\n",
       {"bad.yaml:4:", "export.adapters_dir: PEFT adapters are written for the Hugging Face layouts (model.arch llama, "
                       "mistral, qwen2 or qwen3), not gpt2"}},
      {"export_placeholder", "steps: 1\nmodel: {kind: transformer, arch: llama}\ndata: {}\nexport: {adapters_dir: \"out/{tsk}\"}\n",
       {"bad.yaml:4:", "export.adapters_dir: unknown placeholder '{tsk}'; paths may use {rank}, {job} and {task}"}},
      {"export_at_checkpoints_no_dir", "steps: 1\nmodel: {kind: transformer, arch: llama}\ndata: {}\nexport: {at_checkpoints: true}\n",
       {"bad.yaml:4:", "export.at_checkpoints: is true but there is no export.adapters_dir"}},
      {"token_dtype_unknown", "steps: 1\nmodel: {kind: transformer}\ndata: {kind: tokens, dir: d, token_dtype: int8}\n",
       {"bad.yaml:3:", "data.token_dtype: must be one of npy, uint16, uint32; got 'int8'"}},
      {"lora_target_twice", "steps: 1\nmodel: {kind: transformer}\nlora: {targets: [v, v]}\ndata: {}\n",
       {"bad.yaml:3:", "lora.targets[1]: 'v' is listed twice"}},
      {"lora_rank_zero", "steps: 1\nmodel: {kind: transformer}\nlora: {rank: 0}\ndata: {}\n",
       {"bad.yaml:3:", "lora.rank: must be >= 1, got 0"}},
      {"transformer_vocab_one", "steps: 1\nmodel: {kind: transformer, vocab: 1}\ndata: {}\n",
       {"bad.yaml:2:", "model.vocab: must be >= 2, got 1"}},
      {"transformer_too_big", "steps: 1\nmodel: {kind: transformer, vocab: 16000000, d_model: 4096}\ndata: {}\n",
       {"bad.yaml:2:", "model.vocab: the largest parameter of transformer has"}},
      {"tokens_for_mlp", "steps: 1\nmodel: {kind: multitask_mlp}\ndata: {kind: tokens, dir: d}\n",
       {"'tokens' is for the transformer and TorchScript language models; model.kind is 'multitask_mlp'"}},
      {"transformer_npy", "steps: 1\nmodel: {kind: transformer}\ndata: {kind: npy, dir: d}\n",
       {"the transformer reads tokens: 'synthetic' or 'tokens', not 'npy'"}},
      {"tokens_without_dir", "steps: 1\nmodel: {kind: transformer}\ndata: {kind: tokens}\n",
       {"data.dir: required when data.kind is 'tokens'"}},
      // Token ids a uint16 file cannot hold; masks, evaluation and the best adapter's export.
      {"uint16_for_llama3_vocab", "steps: 1\nmodel: {kind: transformer, vocab: 128256, d_model: 8, heads: 2, d_ff: 8, layers: 1}\n"
                                  "data: {kind: tokens, dir: /tmp, token_dtype: uint16}\n",
       {"bad.yaml:3:", "data.token_dtype: uint16 holds ids up to 65535, but model.vocab is 128256", "uint32"}},
      {"loss_mask_for_mlp", "steps: 1\nmodel: {kind: multitask_mlp}\ndata: {loss_mask: true}\n",
       {"bad.yaml:3:", "data.loss_mask: is for the transformer's token files; model.kind is 'multitask_mlp'"}},
      {"loss_mask_without_files", "steps: 1\nmodel: {kind: transformer}\ndata: {loss_mask: true}\n",
       {"bad.yaml:3:", "data.loss_mask: is true but no token files are read"}},
      {"eval_for_mlp", "steps: 1\nmodel: {kind: multitask_mlp}\ndata: {}\neval: {dir: /tmp}\n",
       {"bad.yaml:4:", "eval.dir: evaluation is for the transformer"}},
      {"streamed_trained_base", "steps: 1\nmodel: {kind: transformer}\ndata: {}\noffload: {shared: stream}\n",
       {"bad.yaml:4:", "offload.shared: stream of a transformer streams its frozen base, but model.train_shared is true"}},
      {"streamed_nf4_base", "steps: 1\nmodel: {kind: transformer, train_shared: false, base_quant: nf4}\ndata: {}\noffload: {shared: stream}\n",
       {"bad.yaml:4:", "offload.shared: stream streams the base in the dtype the GEMMs read"}},
      {"streamed_base_split", "steps: 1\nmodel: {kind: transformer, train_shared: false}\ndata: {}\noffload: {shared: stream, shared_split_layers: 2}\n",
       {"bad.yaml:4:", "offload.shared_split_layers: is the streamed MLP trunk's"}},
      {"streamed_base_window", "steps: 1\nmodel: {kind: transformer, train_shared: false, layers: 2}\ndata: {}\noffload: {shared: stream, shared_prefetch_layers: 2}\n",
       {"bad.yaml:4:", "offload.shared_prefetch_layers: prefetches 2 layers ahead, but the base has 2 layers"}},
      {"eval_dir_missing", "steps: 1\nmodel: {kind: transformer}\ndata: {}\neval: {dir: /nonexistent-thetad-eval}\n",
       {"bad.yaml:4:", "eval.dir: '/nonexistent-thetad-eval' is not a directory (no such directory)"}},
      {"eval_task_out_of_range", "steps: 1\nmodel: {kind: transformer, tasks: 2}\ndata: {}\neval: {dir: /tmp, tasks: [1, 2]}\n",
       {"bad.yaml:4:", "eval.tasks[1]: task id must be in [0, 2)"}},
      {"eval_task_word", "steps: 1\nmodel: {kind: transformer, tasks: 2}\ndata: {}\neval: {dir: /tmp, tasks: [0, all]}\n",
       {"bad.yaml:4:", "eval.tasks[1]: must be a task id, or eval.tasks one of 'all' and 'scheduled' alone; got 'all'"}},
      {"eval_task_twice", "steps: 1\nmodel: {kind: transformer, tasks: 2}\ndata: {}\neval: {dir: /tmp, tasks: [1, 1]}\n",
       {"bad.yaml:4:", "eval.tasks[1]: task 1 is listed twice"}},
      {"eval_rows_zero", "steps: 1\nmodel: {kind: transformer}\ndata: {}\neval: {dir: /tmp, rows: 0}\n",
       {"bad.yaml:4:", "eval.rows: must be > 0, got 0"}},
      {"export_best_without_eval",
       "steps: 1\nmodel: {kind: transformer, arch: llama, train_shared: false, tasks: 1}\ndata: {}\nexport: {adapters_dir: /tmp/x, best: eval_loss}\n",
       {"bad.yaml:4:", "export.best: eval_loss needs an evaluation: set eval.dir"}},
      {"export_best_unknown", "steps: 1\nmodel: {kind: transformer}\ndata: {}\nexport: {best: lowest}\n",
       {"bad.yaml:4:", "export.best: must be one of last, eval_loss; got 'lowest'"}},
      {"base_quant_trained_base", "steps: 1\nmodel: {kind: transformer, base_quant: nf4}\ndata: {}\n",
       {"bad.yaml:2:", "model.base_quant: nf4 holds a frozen base, but model.train_shared is true (the default)"}},
      {"base_quant_not_transformer", "steps: 1\nmodel: {kind: multitask_mlp, train_shared: false, base_quant: nf4}\ndata: {}\n",
       {"bad.yaml:2:", "model.base_quant: nf4 quantizes the transformer's frozen base; model.kind is multitask_mlp"}},
      {"base_quant_unknown", "steps: 1\nmodel: {kind: transformer, train_shared: false, base_quant: int4}\ndata: {}\n",
       {"bad.yaml:2:", "model.base_quant: must be one of none, nf4; got 'int4'"}},
      // Contradictions.
      {"nccl_without_cuda", kHead + "comm:\n  backend: nccl\n",
       {"bad.yaml:5:3: comm.backend:", "this build has no CUDA LibTorch"}},
      {"npy_without_dir", "steps: 10\nmodel: {kind: multitask_mlp}\ndata:\n  kind: npy\n",
       {"bad.yaml:4:3: data.dir: required when data.kind is 'npy'"}},
      {"weighted_without_weights", "steps: 10\nmodel: {kind: multitask_mlp}\ndata:\n  schedule: weighted\n",
       {"bad.yaml:4:3: data.weights:", "one weight per task"}},
      {"weights_wrong_length",
       "steps: 10\nmodel: {kind: multitask_mlp, tasks: 3}\ndata:\n  schedule: weighted\n  weights: [1, 2]\n",
       {"bad.yaml:5:3: data.weights: needs one weight per task: 3 (model.tasks), got 2"}},
      {"weights_negative",
       "steps: 10\nmodel: {kind: multitask_mlp, tasks: 2}\ndata:\n  schedule: weighted\n  weights: [1, -2]\n",
       {"bad.yaml:5:16: data.weights[1]: must be >= 0, got -2"}},
      {"weights_all_zero",
       "steps: 10\nmodel: {kind: multitask_mlp, tasks: 2}\ndata:\n  schedule: weighted\n  weights: [0, 0]\n",
       {"bad.yaml:5:3: data.weights: at least one weight must be > 0"}},
      {"per_rank_missing", "steps: 10\nmodel: {kind: multitask_mlp}\ndata:\n  schedule: per_rank\n",
       {"bad.yaml:4:3: data.per_rank:", "needs a list of task ids for each rank"}},
      {"per_rank_task_out_of_range",
       "steps: 10\nmodel: {kind: multitask_mlp, tasks: 4}\ndata:\n  schedule: per_rank\n"
       "  per_rank:\n    - [0, 1]\n    - [2, 4]\n",
       {"bad.yaml:7:11: data.per_rank[1][1]: task id must be in [0, 4)", "got 4"}},
      {"per_rank_not_a_list_of_lists",
       "steps: 10\nmodel: {kind: multitask_mlp}\ndata:\n  schedule: per_rank\n  per_rank: [0, 1]\n",
       {"bad.yaml:5:14: data.per_rank[0]: expected a list of task ids, got '0'"}},
      {"per_rank_task_twice",
       "steps: 10\nmodel: {kind: multitask_mlp, tasks: 4}\ndata:\n  schedule: per_rank\n"
       "  per_rank: [[0, 1], [2, 2]]\n",
       {"bad.yaml:5:26: data.per_rank[1][1]: task 2 is listed twice for rank 1"}},
      {"batch_smaller_than_tasks",
       "steps: 10\nmodel: {kind: multitask_mlp, tasks: 8}\ndata:\n  schedule: all\n  batch_per_rank: 4\n",
       {"bad.yaml:5:3: data.batch_per_rank: is smaller than the 8 tasks", "'all'"}},
      {"tab_indentation", "steps: 10\nmodel:\n\tkind: multitask_mlp\n",
       {"bad.yaml:3:", "malformed YAML", "tabs"}},
      {"alternate_missing", "steps: 10\nmodel: {kind: multitask_mlp}\ndata:\n  schedule: alternate\n",
       {"bad.yaml:4:3: data.alternate:", "needs the groups to train in turn"}},
      {"alternate_bad_entry",
       "steps: 10\nmodel: {kind: multitask_mlp}\ndata:\n  schedule: alternate\n  alternate: [shared, head]\n",
       {"bad.yaml:5:23: data.alternate[1]: must be 'shared', 'tasks' or 'task:N'", "'head'"}},
      {"alternate_task_out_of_range",
       "steps: 10\nmodel: {kind: multitask_mlp, tasks: 2}\ndata:\n  schedule: alternate\n"
       "  alternate: [shared, \"task:2\"]\n",
       {"bad.yaml:5:23: data.alternate[1]: task id must be in [0, 2)"}},
      {"torchscript_without_trust_code",
       "steps: 10\nmodel:\n  kind: torchscript\n  path: /dev/null\n  shared: [\"trunk.*\"]\n  task: \"heads.{t}.*\"\n"
       "data: {}\n",
       {"bad.yaml:3:3: model.trust_code: model.kind torchscript runs the code of model.path ('/dev/null') with your rights"}},
      {"checkpoint_dir_per_rank", kHead + "checkpoint: {dir: \"ck_{rank}\"}\n",
       {"bad.yaml:4:", "checkpoint.dir: {rank} cannot be used here"}},
      {"path_with_nul", kHead + "log: {file: \"a\\0b\"}\n", {"bad.yaml:4:", "log.file: holds a control character (\\x00 at byte 1)"}},
      {"torchscript_without_path",
       "steps: 10\nmodel:\n  kind: torchscript\n  shared: [\"trunk.*\"]\n  task: \"heads.{t}.*\"\n  trust_code: true\ndata: {}\n",
       {"bad.yaml:3:3: model.path: torchscript needs the path"}},
      {"torchscript_missing_file",
       "steps: 10\nmodel:\n  kind: torchscript\n  path: /nonexistent/model.pt\n  shared: [\"trunk.*\"]\n"
       "  task: \"heads.{t}.*\"\n  trust_code: true\ndata: {}\n",
       {"bad.yaml:4:3: model.path: no such file: '/nonexistent/model.pt'"}},
      {"torchscript_task_without_t",
       "steps: 10\nmodel:\n  kind: torchscript\n  path: /dev/null\n  shared: [\"trunk.*\"]\n"
       "  task: \"heads.*\"\n  trust_code: true\ndata: {}\n",
       {"bad.yaml:6:3: model.task: pattern must contain {t}"}},
      {"torchscript_second_task_pattern_without_t",
       "steps: 10\nmodel:\n  kind: torchscript\n  path: /dev/null\n  shared: [\"trunk.*\"]\n"
       "  task: [\"heads.{t}.*\", \"adapters.*\"]\n  trust_code: true\ndata: {}\n",
       {"bad.yaml:6:25: model.task[1]: pattern must contain {t}", "got 'adapters.*'"}},
      {"torchscript_without_shared",
       "steps: 10\nmodel:\n  kind: torchscript\n  path: /dev/null\n  task: \"heads.{t}.*\"\n  trust_code: true\ndata: {}\n",
       {"bad.yaml:3:3: model.shared: torchscript needs name patterns"}},
      {"extreme_without_classes", "steps: 10\nmodel:\n  kind: extreme_classifier\ndata: {}\n",
       {"bad.yaml:3:3: model.classes: extreme_classifier needs classes > 0"}},
      {"extreme_negatives_negative",
       "steps: 10\nmodel:\n  kind: extreme_classifier\n  classes: 1000\n  negatives_per_step: -1\ndata: {}\n",
       {"bad.yaml:5:3: model.negatives_per_step: must be >= 0"}},
      {"adapter_rank_zero", "steps: 10\nmodel:\n  kind: multitask_adapter\n  adapter_rank: 0\ndata: {}\n",
       {"bad.yaml:4:3: model.adapter_rank: must be >= 1"}},
      {"every_steps_without_dir", kHead + "checkpoint:\n  every_steps: 10\n",
       {"bad.yaml:5:3: checkpoint.dir:", "no checkpoint.dir"}},
      {"all_ranks_metrics_without_rank", kHead + "metrics:\n  path: m.jsonl\n  all_ranks: true\n",
       {"bad.yaml:5:3: metrics.path:", "needs {rank}"}},
      {"unknown_placeholder", kHead + "checkpoint:\n  dir: runs/{jobname}/ckpt\n",
       {"bad.yaml:5:3: checkpoint.dir: unknown placeholder '{jobname}'"}},
      {"job_name_with_slash", kHead + "job: a/b\n", {"bad.yaml:4:1: job: must be a non-empty name"}},
      {"job_name_dotdot", kHead + "job: ..\n", {"bad.yaml:4:1: job: must be a non-empty name", "not '.' or '..'"}},
      // Decidable from the job, else found only by `run`.
      {"device_slots_below_step_groups",
       "steps: 10\nmodel: {kind: multitask_mlp, tasks: 4}\ndata: {tasks_per_rank: 3}\n"
       "offload:\n  enabled: true\n  device_slots: 1\n",
       {"bad.yaml:6:3: offload.device_slots: is 1, fewer than the 3 task groups a rank can use in one "
        "optimizer step with schedule 'round_robin'",
        "data.tasks_per_rank x accumulate_steps = 3 x 1, at most model.tasks (4)"}},
      {"device_slots_default_below_all_tasks",
       "steps: 10\nmodel: {kind: multitask_mlp, tasks: 8}\ndata: {schedule: all}\noffload:\n  enabled: true\n",
       {"bad.yaml:5:3: offload.device_slots: is 4, fewer than the 8 task groups", "'all'"}},
      {"device_slots_below_accumulated_groups",
       "steps: 10\naccumulate_steps: 3\nmodel: {kind: multitask_mlp, tasks: 8}\ndata: {tasks_per_rank: 2}\n"
       "offload: {enabled: true, device_slots: 5}\n",
       {"bad.yaml:5:", "offload.device_slots: is 5, fewer than the 6 task groups",
        "= 2 x 3, at most model.tasks (8)"}},
      {"device_slots_below_per_rank_list",
       "steps: 10\nmodel: {kind: multitask_mlp, tasks: 4}\ndata:\n  schedule: per_rank\n"
       "  per_rank: [[0], [1, 2, 3]]\noffload: {enabled: true, device_slots: 2}\n",
       {"bad.yaml:6:", "offload.device_slots: is 2, fewer than the 3 task groups", "longest list of data.per_rank"}},
      {"bucket_cap_below_one_float", kHead + "comm:\n  bucket_cap_mb: 1e-30\n",
       {"bad.yaml:5:3: comm.bucket_cap_mb: must be at least 4 bytes (one fp32 element), 3.814697265625e-06 MiB",
        "(0 bytes)"}},
      {"first_bucket_below_one_float", kHead + "comm:\n  first_bucket_mb: 0.000002\n",
       {"bad.yaml:5:3: comm.first_bucket_mb: must be at least 4 bytes", "(2 bytes)"}},
      {"weights_sum_infinite",
       "steps: 10\nmodel: {kind: multitask_mlp, tasks: 2}\ndata:\n  schedule: weighted\n  weights: [1e308, 1e308]\n",
       {"bad.yaml:5:3: data.weights: the weights must have a finite sum", ".inf"}},
      {"layer_of_a_petabyte",
       "steps: 10\nmodel:\n  kind: multitask_mlp\n  input_dim: 16777216\n  hidden: 16777216\ndata: {}\n",
       {"bad.yaml:5:3: model.hidden: the largest parameter of multitask_mlp, trunk.0.weight [model.hidden x "
        "model.input_dim = 16777216 x 16777216], has 281474976710656 elements (1 PiB)",
        "at most 2^34 = 17179869184 elements (64 GiB)"}},
      {"head_of_a_petabyte",
       "steps: 10\nmodel:\n  kind: multitask_mlp\n  trunk_layers: 0\n  input_dim: 16777216\n"
       "  output_dim: 16777216\ndata: {}\n",
       {"bad.yaml:6:3: model.output_dim: the largest parameter", "heads.<t>.0.weight"}},
      {"model_total_too_large",
       "steps: 10\nmodel:\n  kind: multitask_mlp\n  tasks: 1048576\n  input_dim: 4096\n  hidden: 4096\n"
       "  head_layers: 2\ndata: {}\n",
       {"bad.yaml:4:3: model.tasks: the parameters of multitask_mlp add up to", "model.tasks (1048576) x",
        "at most 2^38 = 274877906944 parameters (1 TiB)"}},
      {"extreme_slice_too_large",
       "steps: 10\nmodel:\n  kind: extreme_classifier\n  tasks: 1\n  classes: 4294967296\n  hidden: 4096\n"
       "data: {}\n",
       {"bad.yaml:5:3: model.classes: the largest parameter of extreme_classifier, output.<t>.weight "
        "[model.classes x model.hidden = 4294967296 x 4096]"}},
      {"adapter_rank_huge",
       "steps: 10\nmodel:\n  kind: multitask_adapter\n  adapter_rank: 1073741824\ndata: {}\n",
       {"bad.yaml:4:3: model.adapter_rank: must be <= 16777216"}},
      {"adapter_too_large",
       "steps: 10\nmodel:\n  kind: multitask_adapter\n  hidden: 65536\n  adapter_rank: 16777216\ndata: {}\n",
       {"bad.yaml:", "model.adapter_rank: the largest parameter of multitask_adapter, adapters.<t>.<i>.down"}},
      {"accumulate_huge", kHead + "accumulate_steps: 9223372036854775807\n",
       {"bad.yaml:4:1: accumulate_steps: must be <= 1048576"}},
      {"steps_times_accumulate_overflow",
       "steps: 9100000000000000\naccumulate_steps: 1024\nmodel: {kind: multitask_mlp}\ndata: {}\n",
       {"bad.yaml:1:1: steps: steps x accumulate_steps (9100000000000000 x 1024) micro-steps overflow",
        "steps must be <= 9007199254740991"}},
      {"prefetch_huge", kHead + "offload:\n  prefetch: 1000000000000\n",
       {"bad.yaml:5:3: offload.prefetch: must be <= 1024"}},
      {"cpu_threads_huge", kHead + "offload:\n  cpu_threads: 1000000000\n",
       {"bad.yaml:5:3: offload.cpu_threads: must be <= 4096"}},
  };
  return rows;
}

class BadJobTest : public ::testing::TestWithParam<BadJob> {};

TEST_P(BadJobTest, RejectedWithFileLineAndKey) {
  const BadJob& row = GetParam();
  try {
    load_job_from_string(row.yaml, "bad.yaml");
    FAIL() << "accepted:\n" << row.yaml;
  } catch (const JobError& e) {
    const std::string what = e.what();
    ASSERT_FALSE(e.messages().empty());
    for (const auto& m : e.messages()) EXPECT_EQ(m.rfind("bad.yaml:", 0), 0u) << m;
    for (const auto& s : row.expect) EXPECT_NE(what.find(s), std::string::npos) << "want: " << s << "\ngot:\n" << what;
    EXPECT_EQ(exit_code_for(e), kExitBadInput);
  }
}

INSTANTIATE_TEST_SUITE_P(Table, BadJobTest, ::testing::ValuesIn(bad_jobs()),
                         [](const ::testing::TestParamInfo<BadJob>& info) {
                           return std::string(info.param.name);
                         });

TEST(BadJobTable, HasAtLeast35Rows) { EXPECT_GE(bad_jobs().size(), 35u); }

}  // namespace
}  // namespace thetad::config
