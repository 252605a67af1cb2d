// The typed job: every key of a thetad YAML job file, its type and its default.
// Parsed and validated once (loader.cpp); docs/configuration.md documents each key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace thetad::config {

struct ModelConfig {
  std::string kind = "multitask_mlp";  // multitask_mlp | multitask_adapter | extreme_classifier | torchscript
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
  std::vector<std::string> shared;  // torchscript: name patterns of Θ (glob, '*' matches any)
  std::string task;                 // torchscript: pattern of θ[t], with "{t}" for the task index
  int64_t init_seed = -1;       // parameter init seed; -1 = the job's seed
};

struct DataConfig {
  std::string kind = "synthetic";  // synthetic | npy
  std::string dir;                 // npy: directory with task{t}_x.npy / task{t}_y.npy
  int64_t batch_per_rank = 32;
  std::string schedule = "round_robin";  // round_robin | weighted | per_rank | all | alternate
  int64_t tasks_per_rank = 1;      // round_robin/weighted: tasks each rank trains per step
  std::vector<double> weights;     // weighted: per-task weights (length T)
  std::vector<std::vector<int64_t>> per_rank;  // per_rank: task list (0-based) per rank
  std::vector<std::string> alternate;  // alternate: groups trained in turn ("shared", "task:3", "tasks")
  double noise = 0.01;             // synthetic: label noise stddev
};

struct CommConfig {
  std::string backend = "auto";   // auto | mpi | nccl
  double bucket_cap_mb = 25.0;
  double first_bucket_mb = 1.0;
  bool prune = true;
  std::string average = "contributors";  // contributors | world
  std::string active = "declared";       // declared | discover
  double timeout_s = 300.0;
};

struct OffloadConfig {
  bool enabled = false;
  int64_t device_slots = 4;
  double device_budget_mb = 0.0;  // > 0: slots derived from a byte budget instead
  int64_t prefetch = 1;           // steps of lookahead for prefetch
  double shard_mb = 0.0;          // > 0: groups larger than this are split into row shards
  double host_limit_mb = 0.0;     // > 0: refuse to pin a host arena larger than this
  int64_t cpu_threads = 0;        // CPU Adam threads per rank (0 = this rank's share of the CPUs)

  // shard_mb in bytes: the one conversion the store's shards and the model's chunks share.
  size_t shard_bytes() const { return static_cast<size_t>(shard_mb * 1048576.0); }
};

struct OptimizerConfig {
  std::string kind = "adamw";     // adamw | adam | sgd
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  double clip_norm = 0.0;         // > 0: clip each group's gradient norm to this
  int64_t warmup_steps = 0;
  std::string lr_schedule = "constant";  // constant | cosine
  double min_lr = 0.0;
  bool overlap = true;            // GPUs: step each bucket's groups as its allreduce lands
};

struct CheckpointConfig {
  std::string dir;                // "" = no checkpoints
  int64_t every_steps = 0;        // 0 = only at the end and on interruption
  int64_t keep = 3;
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

struct Job {
  std::string source;             // the file it came from
  std::string name = "thetad-job";  // key `job`
  uint64_t seed = 0;
  int64_t steps = 0;              // required
  int64_t accumulate_steps = 1;
  std::string precision = "fp32";
  ModelConfig model;
  DataConfig data;
  CommConfig comm;
  OffloadConfig offload;
  OptimizerConfig optimizer;
  CheckpointConfig checkpoint;
  MetricsConfig metrics;
  LogConfig log;
  TimelineConfig timeline;
};

}  // namespace thetad::config
