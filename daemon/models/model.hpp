// Models and data of the worker (LibTorch). A model lists its parameters in registration order,
// each with its group (0 = shared Θ, t+1 = task t), and runs forward for one task's rows.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/job.hpp"
#include "daemon/ops/frozen_weight.hpp"
#include "daemon/plan/schedule.hpp"

namespace thetad::daemon {

struct Placement;  // daemon/plan/placement.hpp

enum class LossKind { mse, cross_entropy };

class LayerWeights;     // daemon/ops/trunk_layer.hpp
class ActivationStash;  // daemon/ops/trunk_layer.hpp

// Fills a contiguous CPU float32 tensor of a parameter's shape with its initial values.
using ParamInit = std::function<void(torch::Tensor& dst)>;

struct NamedParam {
  std::string name;
  torch::Tensor tensor;  // a leaf that requires grad
  int group = 0;
  // Set for task parameters built lazily (make_model's lazy_tasks): `tensor` is then a
  // placeholder of the right shape (an expanded zero) and `init` writes the values wherever
  // they are to live (the host store's arena), without a full copy on every rank.
  ParamInit init;
  // A frozen base matrix the model computes from a quantized copy of its own
  // (TaskModel::quantize_frozen_base) or reads from a streamed base (homes/streamed_base.hpp):
  // `tensor` holds its values in host memory, where checkpoints, the final hash and the merged
  // export read them, and stays there.
  bool host_only = false;

  // A placeholder's values (init) drawn into a new CPU float32 tensor of its shape.
  torch::Tensor drawn() const {
    torch::Tensor v = torch::empty(tensor.sizes(), torch::kFloat32);
    init(v);
    return v;
  }
};

// Where a row-chunked group's parameter comes from, chunk by chunk: the model's own tensor, or
// the worker's host store (device slots holding row shards). chunk(task, k) is a [rows_k x
// row_elems] view on the compute device, valid until done(task, k); a caller may hold two chunks
// at a time (the next one is requested before the current one is computed, so its copy overlaps
// that compute) and calls done once the compute using the chunk is queued.
class ShardSource {
 public:
  virtual ~ShardSource() = default;
  virtual int num_chunks(int task) = 0;
  virtual torch::Tensor chunk(int task, int k) = 0;
  virtual void done(int task, int k) = 0;
  // Where backward accumulates chunk k's weight gradient ([rows_k x row_elems], zeroed at its
  // first use in an optimizer window), or undefined: into the parameter's .grad, whole (the
  // default). grad_done(task, k) follows once that chunk's gradient is queued, or without
  // grad_chunk for a chunk that gets no gradient in this backward (sampled rows elsewhere); a
  // source can then reduce and move it away, so the whole gradient never exists on the device.
  virtual torch::Tensor grad_chunk(int task, int k) {
    (void)task;
    (void)k;
    return {};
  }
  virtual void grad_done(int task, int k) {
    (void)task;
    (void)k;
  }
};

struct Batch {
  torch::Tensor x;  // [rows, input_dim] float32; the transformer: int64 token ids [rows, seq_len]
  torch::Tensor y;  // [rows, output_dim] float32 (mse), [rows] int64 (cross entropy), [rows, seq_len] (next tokens)
};

// One task's rows in a pass over several tasks (TaskModel::losses).
struct TaskRows {
  int task = 0;
  const Batch* batch = nullptr;
  uint64_t sample_seed = 0;
};

// A fused pass whose task parameters are read from slots: tensors of its own, the same every
// run, so that a CUDA graph can capture the pass once and replay it for any tasks
// (daemon/train/graphed_pass). Made for one number of parts of equal rows.
class SlotPass {
 public:
  virtual ~SlotPass() = default;
  // The leaves the gradients are taken of (requires grad).
  virtual const std::vector<torch::Tensor>& slots() const = 0;
  // Copies tasks[i]'s parameters into position i of the slots (no autograd; on the current
  // stream, before the pass runs).
  virtual void bind(const std::vector<int>& tasks) = 0;
  // Each part's loss (its mean): x holds every part's rows in order, ys each part's targets.
  // The same function as TaskModel::losses of those tasks, with the tasks' parameters bound.
  virtual std::vector<torch::Tensor> losses(const torch::Tensor& x, const std::vector<torch::Tensor>& ys) = 0;
  // Task `task`'s parameter (by name) in each slot, in slots()' order: at position i of the
  // pass, its gradient is the slot's gradient at index i of its first dimension.
  virtual std::vector<std::string> slot_params(int task) const = 0;
};

class TaskModel {
 public:
  virtual ~TaskModel() = default;
  // Registration order; stable for the model's lifetime.
  virtual std::vector<NamedParam>& params() = 0;
  // Output for rows of x that all belong to `task` (0-based).
  virtual torch::Tensor forward(const torch::Tensor& x, int task) = 0;
  virtual LossKind loss_kind() const = 0;
  // The task's loss on a batch; `sample_seed` seeds any sampling (sampled softmax) so that every
  // rank, a resumed run and the reference draw the same. Default: task_loss(forward(x), y).
  virtual torch::Tensor loss(const Batch& batch, int task, uint64_t sample_seed);
  // Each part's loss (its mean, as loss() gives it), in the parts' order. Default: loss() per
  // part. A model that fuses tasks (fuses_tasks(): the transformer) runs what the tasks share
  // once over all their rows, each task's own parameters on its own rows: the same values,
  // in fewer and larger kernels.
  virtual std::vector<torch::Tensor> losses(const std::vector<TaskRows>& parts);
  // train.backward: auto runs such a model's tasks in one pass wherever that pass's activations
  // fit the device (daemon/plan/activation_estimate.hpp), a pass per task elsewhere.
  virtual bool fuses_tasks() const { return false; }
  // A pass of `parts` tasks of `rows` rows each with its task parameters in slots, or nullptr
  // where the model has none (every model but the transformer over a frozen base).
  virtual std::unique_ptr<SlotPass> slot_pass(int parts, int64_t rows) {
    (void)parts;
    (void)rows;
    return nullptr;
  }
  int num_tasks() const { return num_tasks_; }
  // Row-chunked groups (extreme_classifier with offload.shard_mb > 0): the group's one parameter
  // is a [rows x row_elems] matrix the model computes over in row chunks, read through the
  // source given here (nullptr: its own parameter). The worker registers such groups with the
  // store by rows and passes a source over the store's shards.
  virtual bool row_chunked(int group) const {
    (void)group;
    return false;
  }
  virtual void set_shard_source(ShardSource* source) { (void)source; }
  // Models whose trunk runs through trunk_layer (multitask_mlp's trunk, extreme_classifier's
  // encoder): where the trunk's weights (nullptr: its own parameters) and the tensors its layers
  // save for backward (nullptr: kept by autograd) live. Other models ignore both.
  virtual bool has_trunk_layers() const { return false; }
  virtual void set_layer_weights(LayerWeights* weights) { (void)weights; }
  virtual void set_activation_stash(ActivationStash* stash) { (void)stash; }
  // Whether set_activation_stash is used: the trunk layers', or the transformer's feed-forward
  // activations'.
  virtual bool stashes_activations() const { return has_trunk_layers(); }
  // model.base_quant: the frozen base's matrices quantized on `compute` (the rank's device: a
  // model built on the host for a host store is quantized on its GPU, not on the CPU), once its
  // values are loaded, the parameters' own values moved to host memory (NamedParam::host_only).
  // Only the transformer has such a base (validation refuses the key elsewhere).
  virtual void quantize_frozen_base(torch::Device compute) { (void)compute; }
  // offload.shared: stream: the frozen base's layers' GEMMs (their matrices, rows joined) for a
  // source of their values to take (daemon/homes/streamed_base.hpp), and, once it has them, the
  // model reads them from it. Only the transformer has such a base (validation refuses the rest).
  virtual std::vector<BaseGemm> frozen_gemms() { return {}; }
  virtual void read_frozen_gemms(FrozenWeights& source, const std::vector<BaseGemm>& gemms) {
    (void)source, (void)gemms;
  }

 protected:
  int num_tasks_ = 0;
};

// Builds the model of job.model on `device`; parameters are initialized identically on every
// rank from (init seed, group, parameter index), independent of the other groups. With
// `lazy_tasks` (the host store; device must be the CPU) task parameters are placeholders with
// NamedParam::init set, where the model can (all but torchscript). model.path is read as given:
// the caller expands its placeholders for its rank (with_input_paths, daemon/plan/input_path.hpp).
// `place`: where the job's groups live, as the trainer decided it once (Placement::of); the
// models read from it what they build differently (a lazy store's placeholders, a frozen base in
// bf16, a drawn base drawn later, a streamed base's layers, row shards). The overload without it
// builds a model outside a trainer (tests, tools): one rank's placement.
std::unique_ptr<TaskModel> make_model(const config::Job& job, const Placement& place, torch::Device device,
                                      bool lazy_tasks = false, torch::Device compute = torch::kCPU);
std::unique_ptr<TaskModel> make_model(const config::Job& job, torch::Device device, bool lazy_tasks = false,
                                      torch::Device compute = torch::kCPU);

// Training data: a pure function of (step, rank, task, rows) so that every rank, a resumed run
// and the single-process reference see the same batches.
class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual Batch batch(int64_t step, int rank, int world, int task, int64_t rows) = 0;
};

// The inputs of one forward pass over a micro-step's tasks plan.tasks[first, end) that have
// rows: each task's batch and its sample seed (the same on every rank, in a resumed run and in
// the reference), ready for TaskModel::losses.
struct PassInputs {
  std::vector<Batch> batches;
  std::vector<TaskRows> parts;  // point into batches
  std::vector<int64_t> rows;
};
PassInputs pass_inputs(DataSource& data, const StepPlan& plan, size_t first, size_t end, int64_t micro,
                       int rank, int world, uint64_t seed);

// Opens and checks all data before any step runs (ConfigError naming the file on a problem).
// data.dir is read as given: the caller expands its placeholders (with_input_paths).
std::unique_ptr<DataSource> make_data(const config::Job& job, const TaskModel& model,
                                      torch::Device device);

// Per-task loss of a model output.
torch::Tensor task_loss(LossKind kind, const torch::Tensor& out, const torch::Tensor& y);
// Cross-entropy of logits [rows, seq, vocab] against the next tokens [rows, seq], over every
// position (language models: the transformer, TorchScript models on token data).
torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& next);

// 64-bit mixing of several integers (splitmix64 chain); seeds for generators.
uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0);

}  // namespace thetad::daemon
