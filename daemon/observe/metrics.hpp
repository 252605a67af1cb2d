// Per-step metrics as JSON lines (docs/architecture.md "Interfaces users see"): one record per step and
// rank, written and flushed as the step ends so a crashed run keeps every finished step, and one
// per evaluation (eval.dir: its per-task losses, a record of its own kind). Beside the file, the
// effective job it came from (PATH.job.yaml). Also the small JSON text helpers that the timeline
// shares.
#pragma once

#include <cmath>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "common/text.hpp"

namespace thetad::daemon {

struct TaskLoss {
  int task = 0;
  double loss = 0.0;
};

// The wall clock now as ISO 8601 in UTC with milliseconds ("2025-03-01T12:00:00.250Z").
std::string utc_time_now();

// A host store's traffic and work in one step (θ[t]'s store; Θ's own with offload.shared: stream).
struct StoreTraffic {
  int64_t h2d_bytes = 0;
  int64_t d2h_bytes = 0;
  int64_t swap_hits = 0;
  int64_t swap_misses = 0;
  int64_t host_pinned_bytes = 0;
  double cpu_adam_ms = 0.0;         // this rank's CPU Adam for the groups it owns
  double acquire_wait_ms = 0.0;     // host time acquire() waited for a group's CPU update
  int64_t cache_loads = 0;          // offload.device_cache_mb: groups loaded into the device cache
  int64_t cache_flushes = 0;        // groups this rank copied back to the host when evicted
  int64_t device_steps = 0;         // groups stepped on the device (cache or transit lines) this step
  int64_t streamed_steps = 0;       // of those, groups streamed through a transit line (offload.uncached_update)
};

// Every field docs/architecture.md lists. Times in milliseconds, sizes in bytes; counters are per step
// (not cumulative) so that records can be summed or averaged by whoever reads them.
struct StepRecord {
  int64_t step = 0;
  int rank = 0;
  double loss = 0.0;                // mean over this rank's tasks
  std::vector<TaskLoss> task_loss;  // per task in this rank's batch
  double lr = 0.0;
  int64_t samples = 0;              // rows processed by this rank this step
  double step_ms = 0.0;
  double forward_ms = 0.0;
  double backward_ms = 0.0;
  double comm_wait_ms = 0.0;        // compute stalled on allreduce completion after backward
  double optimizer_ms = 0.0;
  double count_exchange_ms = 0.0;   // the active-group count exchange (begin_step)
  int64_t bytes_allreduced = 0;
  int64_t bytes_pruned = 0;         // bytes a prune-less engine would have sent in addition
  int64_t buckets_launched = 0;
  int64_t buckets_pruned = 0;
  int64_t buckets_broadcast = 0;  // of the launched: sent from their one contributor
  int64_t buckets_kept = 0;       // not sent: their one contributor kept the gradient (the replica rule)
  int64_t bytes_kept = 0;         // their bytes (what sending them would have put on the wire)
  int64_t bytes_state_moved = 0;  // group state (values, moments) moved to where the schedule needs it
  int64_t state_moves = 0;        // such moves (point-to-point or broadcast)
  // The bandwidth the engine's collectives achieved (comm/bandwidth.hpp): GB/s over the buckets
  // that completed since the last record, and the time they took.
  double allreduce_algbw_gbs = 0.0;
  double allreduce_busbw_gbs = 0.0;
  double broadcast_algbw_gbs = 0.0;
  double comm_busy_ms = 0.0;
  int64_t grad_stream_peak_bytes = 0;  // shard gradients (streamed groups) the engine held at once
  int64_t device_mem_peak_bytes = 0;
  StoreTraffic store;               // θ[t]'s host store (offload)
  int64_t act_offload_bytes = 0;    // offload.activations: saved tensors copied to the host and back
  int64_t act_device_peak_bytes = 0;  // the most bytes of saved tensors the stash held on the device
  int64_t act_layer_bytes = 0;      // the largest one layer's saved tensors (the window's unit)
  int64_t act_pool_allocations = 0;  // pinned host buffers allocated so far (constant once warm)
  // offload.shared: stream: Θ's own store (its layers' copies, slots and CPU AdamW).
  StoreTraffic theta;                   // its traffic (h2d, d2h, device_steps, cpu_adam_ms)
  int64_t theta_device_slot_bytes = 0;  // device memory of Θ's layer slots (the prefetch window) and device layers
  // GPUs: the step's device memory by what holds it (daemon/train/memory_breakdown.hpp); the
  // parts sum to mem_step_peak_bytes, device_mem_peak_bytes is the largest of those so far.
  int64_t mem_params_bytes = 0;
  int64_t mem_grads_bytes = 0;
  int64_t mem_optimizer_bytes = 0;
  int64_t mem_lines_bytes = 0;
  int64_t mem_activations_bytes = 0;
  int64_t mem_other_bytes = 0;
  int64_t mem_step_peak_bytes = 0;
  int64_t nonfinite = 0;            // 1: the step's loss was NaN or Inf on some rank (train.on_nonfinite)
  int64_t skipped = 0;              // 1: the step updated nothing (train.on_nonfinite: skip_step)
  std::string time;                 // UTC, ISO 8601: when the record was finished (its losses read)
  double samples_per_s = 0.0;       // every rank's rows of the step over step_ms
  double tokens_per_s = std::nan("");  // token models: every rank's positions over step_ms (null otherwise)
  // The norm of the step's reduced gradient (after the allreduce, before clipping and the update)
  // over every group some rank trained, and per task group; NaN (null) where a trained group's
  // gradient never exists whole on the device (row shards, a streamed base).
  double grad_norm = std::nan("");
  std::vector<TaskLoss> grad_norm_task;  // {task, norm}, ascending by task
};

// One evaluation (eval.dir): after `step` steps (the checkpoint of that step holds the same
// parameters), each evaluated task's mean loss over its held-out windows' counted targets.
struct EvalRecord {
  int64_t step = 0;
  std::string time;                 // UTC, ISO 8601
  std::vector<TaskLoss> eval_loss;  // ascending by task; NaN (null) for a task with no counted target
  std::vector<int64_t> eval_tokens;  // per entry of eval_loss: the targets it counted
  double eval_ms = 0.0;             // the evaluation's wall time (forward passes and the gather)
};

// JSON strings: append_json_string and json_string of common/text.hpp.

// Appends a number; NaN and ±Inf, which JSON cannot represent, become null.
void append_json_number(std::string& out, double v);
void append_json_number(std::string& out, int64_t v);

// The record as one JSON object, no trailing newline. Key order is stable (field order).
std::string to_json(const StepRecord& r);
std::string to_json(const EvalRecord& r);
// The step of a record line written by to_json, or -1 for anything else (a torn line); `eval`
// (where given) says whether it is an evaluation's record.
int64_t step_of_record(const std::string& line, bool* eval = nullptr);

class MetricsWriter {
 public:
  // Creates the parent directories and opens `path`: a fresh run (resume_step 0) starts a new
  // file, and a non-empty one already there (an earlier run's, with its PATH.job.yaml) is moved
  // aside first to STEM.previous-<UTC time>EXT beside it (`metrics.jsonl` ->
  // `metrics.previous-20250301T120000Z.jsonl`), never overwritten; for a run resumed at
  // resume_step, the step records of steps before it and the evaluations up to it are kept and
  // the others (what a crashed run wrote after its last checkpoint, which the resumed run
  // replays, and a torn last line) are dropped, so that each step has one record. `job_yaml`
  // (not empty) is written to PATH.job.yaml (the effective job, `--set` applied). Throws ConfigError
  // naming the path if it cannot. Before anything is truncated, `path`.lock is locked (flock, held
  // for the writer's lifetime, released by the kernel if the process dies): a second job on the
  // same metrics.path is refused with ConfigError naming the holder. The file and its lock are
  // never opened through a symbolic link, nor when another user owns them (safe_file.hpp): a
  // link planted in a shared directory is refused, not followed.
  explicit MetricsWriter(const std::string& path, int64_t resume_step = 0, const std::string& job_yaml = "");
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // One line per record, flushed. Thread-safe. Throws Error if the write fails (disk full).
  void write(const StepRecord& r);
  void write(const EvalRecord& r);
  const std::string& path() const { return path_; }
  // Where a fresh run moved the earlier run's file ("" if there was none).
  const std::string& moved_aside() const { return aside_; }

 private:
  void write_line(std::string line);
  std::string aside_;
  std::string path_;
  int lock_fd_ = -1;
  int fd_ = -1;  // the metrics file, O_APPEND
  std::mutex mu_;
};

}  // namespace thetad::daemon
