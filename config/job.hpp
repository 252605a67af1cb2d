// The typed job: every key of a thetad YAML job file, its type and its default.
// Parsed and validated once (loader.cpp); docs/configuration.md documents each key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace thetad::config {

// The choices of the job file. Each enumerator is the YAML word of the same spelling (lower case,
// '_' kept); to_string gives the word back (to_yaml, fingerprint, logs) and from_string parses it.
enum class Precision { Fp32, Tf32, Bf16 };                    // fp32 | tf32 | bf16
enum class GradDtype { Fp32, Bf16 };                          // fp32 | bf16 (comm.grad_dtype)
enum class Backend { Auto, Mpi, Nccl };                       // auto | mpi | nccl
enum class Average { Contributors, World };                   // contributors | world
enum class Active { Declared, Discover };                     // declared | discover
enum class ScheduleKind { RoundRobin, Weighted, PerRank, All, Alternate };  // round_robin | ...
enum class DataKind { Synthetic, Npy, Tokens };               // synthetic | npy | tokens
enum class ModelKind { MultitaskMlp, MultitaskAdapter, ExtremeClassifier, Torchscript, Transformer };
enum class OptimizerKind { AdamW, Adam, Sgd };                // adamw | adam | sgd
enum class LrSchedule { Constant, Cosine };                   // constant | cosine
enum class NonFinite { Stop, SkipStep, Warn };                // stop | skip_step | warn
enum class SharedMode { Resident, Stream };                   // resident | stream (offload.shared)
enum class H2dDtype { Fp32, Bf16 };                           // fp32 | bf16 (offload.h2d_dtype)
enum class HostGroups { All, Scheduled };                     // all | scheduled (offload.host_groups)
enum class UncachedUpdate { Auto, Host, Device };             // auto | host | device (offload.uncached_update)
// gpt2 | llama | mistral | qwen2 | qwen3 (model.arch; the last four: Hugging Face's model_type)
enum class ModelArch { Gpt2, Llama, Mistral, Qwen2, Qwen3 };
enum class RopeScaling { None, Llama3 };                      // none | llama3 (model.rope_scaling)
enum class BaseQuant { None, Nf4 };                           // none | nf4 (model.base_quant)
enum class BaseShard { None, Node };                          // none | node (model.base_shard)
enum class ExportDtype { Fp32, Bf16, Fp16 };                  // fp32 | bf16 | fp16 (export.dtype)
enum class TokenDtype { Npy, Uint16, Uint32 };                // npy | uint16 | uint32 (data.token_dtype)
enum class Backward { Auto, Joint, PerTask };                 // auto | joint | per_task (train.backward)
enum class SoleUser { Keep, Broadcast };                      // keep | broadcast (comm.sole_user)
enum class ExportPick { Last, EvalLoss };                     // last | eval_loss (export.best)

const std::string& to_string(Precision v);
const std::string& to_string(GradDtype v);
const std::string& to_string(Backend v);
const std::string& to_string(Average v);
const std::string& to_string(Active v);
const std::string& to_string(ScheduleKind v);
const std::string& to_string(DataKind v);
const std::string& to_string(ModelKind v);
const std::string& to_string(OptimizerKind v);
const std::string& to_string(LrSchedule v);
const std::string& to_string(NonFinite v);
const std::string& to_string(SharedMode v);
const std::string& to_string(H2dDtype v);
const std::string& to_string(HostGroups v);
const std::string& to_string(UncachedUpdate v);
const std::string& to_string(ModelArch v);
const std::string& to_string(RopeScaling v);
const std::string& to_string(BaseQuant v);
const std::string& to_string(BaseShard v);
const std::string& to_string(ExportDtype v);
const std::string& to_string(TokenDtype v);
const std::string& to_string(Backward v);
const std::string& to_string(SoleUser v);
const std::string& to_string(ExportPick v);

// False (and `out` unchanged) when `word` is not one of the type's YAML words.
bool from_string(const std::string& word, Precision& out);
bool from_string(const std::string& word, GradDtype& out);
bool from_string(const std::string& word, Backend& out);
bool from_string(const std::string& word, Average& out);
bool from_string(const std::string& word, Active& out);
bool from_string(const std::string& word, ScheduleKind& out);
bool from_string(const std::string& word, DataKind& out);
bool from_string(const std::string& word, ModelKind& out);
bool from_string(const std::string& word, OptimizerKind& out);
bool from_string(const std::string& word, LrSchedule& out);
bool from_string(const std::string& word, NonFinite& out);
bool from_string(const std::string& word, SharedMode& out);
bool from_string(const std::string& word, H2dDtype& out);
bool from_string(const std::string& word, HostGroups& out);
bool from_string(const std::string& word, UncachedUpdate& out);
bool from_string(const std::string& word, ModelArch& out);
bool from_string(const std::string& word, RopeScaling& out);
bool from_string(const std::string& word, BaseQuant& out);
bool from_string(const std::string& word, BaseShard& out);
bool from_string(const std::string& word, ExportDtype& out);
bool from_string(const std::string& word, TokenDtype& out);
bool from_string(const std::string& word, SoleUser& out);
bool from_string(const std::string& word, Backward& out);
bool from_string(const std::string& word, ExportPick& out);

// One entry of data.alternate: the groups trained in that step.
struct AlternateEntry {
  enum class Kind { Shared, Task, Tasks };  // "shared" | "task:N" | "tasks"
  Kind kind = Kind::Shared;
  int64_t task = -1;  // Kind::Task: the task id N

  // "shared", "task:N" (N of 1 to 9 digits) or "tasks"; false for anything else.
  static bool parse(const std::string& word, AlternateEntry& out);
};

// MiB (the job file's unit of sizes) to bytes: the one conversion of every *_mb key. Saturates
// (validation reports values out of range; a conversion out of size_t's range is undefined).
inline size_t mib_to_bytes(double mib) {
  const double bytes = mib * 1048576.0;
  if (!(bytes > 0)) return 0;  // also NaN
  if (bytes >= 18446744073709551615.0) return static_cast<size_t>(-1);
  return static_cast<size_t>(bytes);
}

// The transformers of Hugging Face's decoder layout (all but gpt2): RMSNorm, rotary positions,
// SwiGLU, grouped-query attention.
inline bool llama_family(ModelArch a) { return a != ModelArch::Gpt2; }

struct ModelConfig {
  ModelKind kind = ModelKind::MultitaskMlp;
  int64_t input_dim = 64;
  int64_t hidden = 128;
  int64_t output_dim = 1;       // per-task output width (regression targets) for mlp/adapter
  int64_t trunk_layers = 2;
  int64_t head_layers = 1;
  int64_t tasks = 4;            // T: number of per-task groups
  int64_t adapter_rank = 8;     // multitask_adapter: rank of each task's low-rank adapter
  int64_t classes = 0;          // extreme_classifier: rows of the output layer
  int64_t negatives_per_step = 0;  // extreme_classifier: sampled negative classes per step
  std::string path;             // torchscript: model file
  // torchscript: the file is code that runs with the user's rights; it is run only when true
  bool trust_code = false;
  std::vector<std::string> shared;  // torchscript: name patterns of Θ (glob, '*' matches any)
  // torchscript: the name patterns of θ[t], each with "{t}" for the task index (a job may give one
  // string or a list: a model with adapters.{t}.* and heads.{t}.* needs two).
  std::vector<std::string> task;
  int64_t init_seed = -1;       // parameter init seed; -1 = the job's seed
  // initial weights: a torch.save'd state dict, a checkpoint group file, a .safetensors file or a
  // Hugging Face model directory (safetensors, config.json)
  std::string init_from;
  // transformer: decoder-only, pre-norm (docs/configuration.md). gpt2: LayerNorm, learned
  // positions, GELU; llama: RMSNorm, rotary positions, SwiGLU, grouped-query attention; mistral:
  // llama's computation; qwen2: llama with biases on q, k and v; qwen3: llama with an RMSNorm of
  // each query and key head before the rotary positions.
  ModelArch arch = ModelArch::Gpt2;
  int64_t layers = 2;
  int64_t d_model = 64;
  int64_t heads = 4;
  int64_t d_ff = 256;
  int64_t vocab = 256;
  int64_t seq_len = 32;
  int64_t kv_heads = 0;         // llama: key/value heads (grouped-query attention); 0 = heads
  double rope_theta = 10000.0;  // llama: base of the rotary position angles
  int64_t head_dim = 0;         // llama: width of an attention head; 0 = d_model / heads
  // llama: the rotary frequencies remapped as Llama 3.1 does (rope_scaling llama3): those of
  // wavelength above original_max_positions / low_freq_factor divided by rope_factor, those below
  // original_max_positions / high_freq_factor kept, those between interpolated.
  RopeScaling rope_scaling = RopeScaling::None;
  double rope_factor = 8.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_positions = 8192;
  double norm_eps = 1e-5;       // the epsilon of LayerNorm (gpt2) or RMSNorm (llama)
  bool tie_embeddings = false;  // the output layer is the token embedding (no lm_head)
  bool train_shared = true;     // false: Θ (the base) frozen: no gradients, buckets or optimizer state
  // A frozen transformer base's linear weights held on the device in 4-bit NormalFloat (nf4),
  // dequantized layer by layer where they are read (daemon/ops/nf4.hpp); none: as loaded.
  BaseQuant base_quant = BaseQuant::None;
  // A frozen transformer base's layers sharded over the ranks of a node (each device holds 1/N of
  // every layer), gathered layer by layer into device slots ahead of use; none: whole on each.
  BaseShard base_shard = BaseShard::None;

  // The width of an attention head: head_dim, or d_model / heads where it is 0.
  int64_t head_size() const { return head_dim > 0 ? head_dim : heads > 0 ? d_model / heads : 0; }
};

// transformer: the per-task LoRA adapters θ[t] (section `lora`).
struct LoraConfig {
  int64_t rank = 8;
  double alpha = 16.0;          // the adapter's output is scaled by alpha / rank
  std::vector<std::string> targets = {"q", "v"};  // of q, k, v, o, gate (llama), up, down
  // PEFT adapter directories to start the adapters from, with {task} for the task index; a task
  // whose directory does not exist starts afresh.
  std::string init_from;
};

struct DataConfig {
  DataKind kind = DataKind::Synthetic;
  std::string dir;                 // npy: directory with task{t}_x.npy / task{t}_y.npy
  int64_t batch_per_rank = 32;
  ScheduleKind schedule = ScheduleKind::RoundRobin;
  int64_t tasks_per_rank = 1;      // round_robin/weighted: tasks each rank trains per step
  std::vector<double> weights;     // weighted: per-task weights (length T)
  std::vector<std::vector<int64_t>> per_rank;  // per_rank: task list (0-based) per rank
  std::vector<std::string> alternate;  // alternate: groups trained in turn ("shared", "task:3", "tasks")
  std::vector<AlternateEntry> alternate_entries;  // `alternate` parsed (load_job fills it)
  double noise = 0.01;             // synthetic: label noise stddev
  // tokens: task{t}.npy, or flat little-endian task{t}.bin of uint16 or uint32 token ids
  TokenDtype token_dtype = TokenDtype::Npy;
  // tokens (and eval.dir): task{t}.mask.bin beside each token file, a uint8 per token (1: the
  // token is a target the loss counts, 0: a prompt token it skips); the loss is the mean over the
  // counted targets
  bool loss_mask = false;
};

// Held-out evaluation per task (section `eval`, the transformer): eval.dir holds task{t} token
// files as data.dir does; every `every_steps` steps and at the run's end, the first `rows`
// windows of each evaluated task's file are run forward only and their mean loss recorded.
struct EvalConfig {
  std::string dir;                 // "" = no evaluation
  int64_t every_steps = 0;         // 0 = at the run's end only
  int64_t rows = 32;               // windows of seq_len + 1 tokens per task (fewer if its file is short)
  // "all", "scheduled" (the tasks trained since the previous evaluation) or task ids
  std::vector<std::string> tasks = {"all"};
};

// eval.tasks read: which tasks an evaluation covers.
struct EvalTasks {
  enum class Kind { All, Scheduled, List };
  Kind kind = Kind::All;
  std::vector<int64_t> ids;  // Kind::List, ascending
};
// eval.tasks of a validated job.
EvalTasks eval_tasks(const std::vector<std::string>& words);

// What a transformer of Hugging Face's layout writes at the end (section `export`): PEFT adapter
// directories per task, and merged model directories of chosen tasks.
struct ExportConfig {
  std::string adapters_dir;        // with {task} (and {job}); empty: no export
  bool at_checkpoints = false;     // also at every checkpoint step (only adapters trained since)
  std::string base_model;          // adapter_config.json's base_model_name_or_path; "" = model.init_from
  // Which adapter of a task is exported: the last one, or the one at its lowest eval loss
  ExportPick best = ExportPick::Last;
  ExportDtype dtype = ExportDtype::Fp32;  // of the adapters' and the merged models' tensors
  // A Hugging Face model directory per task of merged_tasks (with {task}; empty: none): the base
  // with the task's adapters folded into its matrices, config.json copied from model.init_from.
  std::string merged_dir;
  std::vector<int64_t> merged_tasks;  // the tasks merged; empty with one task: task 0
  double max_shard_mb = 4096;      // a merged model's safetensors files hold at most this each

  bool any() const { return !adapters_dir.empty() || !merged_dir.empty(); }
};

struct CommConfig {
  Backend backend = Backend::Auto;
  double bucket_cap_mb = 25.0;
  double first_bucket_mb = 1.0;
  bool prune = true;
  Average average = Average::Contributors;
  Active active = Active::Declared;
  double timeout_s = 300.0;
  // The dtype gradients travel in: bf16 rounds each rank's share (already divided by the
  // contributors or the world) to bfloat16, halving the bytes; the sum lands in fp32 gradients.
  GradDtype grad_dtype = GradDtype::Fp32;
  // A resident group one rank trains in a window: keep its gradient on that rank (the others'
  // replicas go stale until the schedule needs them: docs/architecture.md, "Who holds a group's
  // current values"), or broadcast it as any other.
  SoleUser sole_user = SoleUser::Keep;

  size_t bucket_cap_bytes() const { return mib_to_bytes(bucket_cap_mb); }
  size_t first_bucket_bytes() const { return mib_to_bytes(first_bucket_mb); }
};

struct OffloadConfig {
  bool enabled = false;
  int64_t device_slots = 4;
  double device_budget_mb = 0.0;  // > 0: slots derived from a byte budget instead
  int64_t prefetch = 1;           // steps of lookahead for prefetch
  double shard_mb = 0.0;          // > 0: groups larger than this are split into row shards
  double host_limit_mb = 0.0;     // > 0: refuse to pin a host arena larger than this
  int64_t cpu_threads = 0;        // CPU Adam threads per rank (0 = this rank's share of the CPUs)
  bool activations = false;       // trunk layers' saved tensors in pinned host memory between forward and backward
  // Θ (the shared trunk): on the device (resident) or in a host store of its own, streamed
  // onto the device layer by layer in forward and backward (stream).
  SharedMode shared = SharedMode::Resident;
  int64_t shared_prefetch_layers = 1;  // stream: layers brought onto the device ahead of the one computing
  // stream: the lowest trunk layers kept on the device with their Adam state and updated there
  // (the device AdamW), the others streamed and updated by the host's CPU AdamW: a count, or
  // "auto" (as many as the device's free memory holds after set-up, less the margin that
  // device_cache_mb auto keeps; none on the CPU).
  std::string shared_device_layers = "0";
  // stream: of the streamed layers, the lowest N are updated on the device within each step, their
  // Adam moments streamed in and back out with their values (12 B per parameter each way), the
  // others by the host's CPU AdamW (4 B of gradient out, 28 B through host memory): a count, or
  // "auto" (from the PCIe and CPU AdamW bandwidths measured at start-up, so that both end
  // together; none on the CPU). 0 by default: on the H100 host measured so far no split was
  // faster than none (docs/BENCHMARKS.md).
  std::string shared_split_layers = "0";
  // The device cache of whole task groups with their Adam state (updated on the device while
  // cached): "auto" (GPUs: the device memory free after set-up, less a margin; none on the CPU)
  // or a size in MiB (0 = none).
  std::string device_cache_mb = "auto";
  // The dtype the stores' parameters cross to the device in (θ[t] on the host path, streamed Θ):
  // bf16 (precision bf16 only) halves the H2D bytes, the host keeps the fp32 master; it costs the
  // CPU AdamW 2 more bytes written per parameter, so fp32 is the default (docs/configuration.md).
  H2dDtype h2d_dtype = H2dDtype::Fp32;
  // The task groups the host arena holds: all of them, or those the job's schedule uses in steps
  // [0, steps) on any rank (the others are never updated, so their values stay the ones the seed
  // draws: checkpoints record them as initial and whoever reads them draws them again).
  HostGroups host_groups = HostGroups::All;
  // Where a task group that the device cache does not keep is updated at a step that uses it:
  // host (its owner's CPU AdamW), device (its Adam state streamed onto the device for the step,
  // the device AdamW, streamed back), or auto (per step, from the schedule and the PCIe and CPU
  // AdamW bandwidths measured at the first such step). Only with a device cache too small for
  // every group: then some of its lines are kept for the streamed groups.
  UncachedUpdate uncached_update = UncachedUpdate::Auto;

  // shard_mb in bytes: the one conversion the store's shards and the model's chunks share.
  size_t shard_bytes() const { return mib_to_bytes(shard_mb); }
  size_t device_budget_bytes() const { return mib_to_bytes(device_budget_mb); }
  size_t host_limit_bytes() const { return mib_to_bytes(host_limit_mb); }
  bool device_cache_auto() const { return device_cache_mb == "auto"; }
  bool shared_device_layers_auto() const { return shared_device_layers == "auto"; }
  bool shared_split_layers_auto() const { return shared_split_layers == "auto"; }
  // The count of shared_split_layers (after validation; "auto" is resolved on the device: 0 here).
  int64_t shared_split_layer_count() const {
    return shared_split_layers_auto() ? 0 : std::strtoll(shared_split_layers.c_str(), nullptr, 10);
  }
  // The count of shared_device_layers (after validation; "auto" is resolved on the device: 0 here).
  int64_t shared_device_layer_count() const {
    return shared_device_layers_auto() ? 0 : std::strtoll(shared_device_layers.c_str(), nullptr, 10);
  }
  // The size of device_cache_mb (after validation; "auto" is resolved on the device: 0 here).
  size_t device_cache_bytes() const {
    return device_cache_auto() ? 0 : mib_to_bytes(std::strtod(device_cache_mb.c_str(), nullptr));
  }
};

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::AdamW;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  double clip_norm = 0.0;         // > 0: clip each group's gradient norm to this
  int64_t warmup_steps = 0;
  LrSchedule lr_schedule = LrSchedule::Constant;
  double min_lr = 0.0;
  bool overlap = true;            // GPUs: step each bucket's groups as its allreduce lands
};

struct TrainConfig {
  NonFinite on_nonfinite = NonFinite::Stop;  // a non-finite loss: stop (exit 1), skip the step, or warn
  // One backward over the sum of a micro-step's task losses (joint), or one per task (per_task:
  // one task's graph alive at a time, or train.tasks_per_pass tasks'); auto: joint where it fits, else
  // passes of as many tasks as fit, where Θ takes no gradient and is not streamed.
  Backward backward = Backward::Auto;
  // Where the passes split (per_task; auto where it splits, at least): the tasks a pass runs, their rows
  // fused where the model fuses tasks. A streamed or sharded base is brought in once a pass.
  int64_t tasks_per_pass = 1;
  // GPUs: a pass that can (the transformer over a frozen base, parts of equal rows) is captured
  // once as a CUDA graph and replayed (daemon/train/graphed_pass).
  bool cuda_graphs = true;
};

struct CheckpointConfig {
  std::string dir;                // "" = no checkpoints
  int64_t every_steps = 0;        // 0 = only at the end and on interruption
  int64_t keep = 3;
  bool async = true;              // written by a background thread while training goes on
};

struct MetricsConfig {
  std::string path;               // "" = no metrics file; "{rank}" and "{job}" expand
  bool all_ranks = false;
};

struct LogConfig {
  std::string level = "info";
  std::string file;               // per-rank log file; "{rank}" and "{job}" expand
  double progress_every_s = 10.0;
};

struct TimelineConfig {
  std::string path;               // Chrome-trace JSON per rank; "{rank}" and "{job}" expand
};

// A job name: letters, digits, '.', '_' and '-', at most 255 of them, not "." or ".." (it becomes
// part of paths through {job}, and checkpoint manifests carry it).
inline bool is_job_name(const std::string& s) {
  if (s.empty() || s.size() > 255 || s == "." || s == "..") return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      return false;
  return true;
}

struct Job {
  std::string source;             // the file it came from
  std::vector<std::string> warnings;  // keys without effect in this job (file:line:key), for the CLI
  std::vector<std::string> notes;     // what the user has opted into (file:line:key), for the CLI
  std::string name = "thetad-job";  // key `job`
  uint64_t seed = 0;
  int64_t steps = 0;              // required
  int64_t accumulate_steps = 1;
  Precision precision = Precision::Fp32;
  ModelConfig model;
  LoraConfig lora;
  DataConfig data;
  EvalConfig eval;
  ExportConfig export_;           // section `export`
  CommConfig comm;
  OffloadConfig offload;
  OptimizerConfig optimizer;
  TrainConfig train;
  CheckpointConfig checkpoint;
  MetricsConfig metrics;
  LogConfig log;
  TimelineConfig timeline;
};

}  // namespace thetad::config
