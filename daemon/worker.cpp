// The training loop of one rank: schedule -> count exchange -> forward -> backward through the
// bucketed engine (autograd post-accumulate hooks) -> per-group optimizer -> metrics and
// checkpoints. The one LibTorch translation unit of the loop.
#include "daemon/worker.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#if THETAD_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <chrono>
#include <deque>
#include <cmath>
#include <iomanip>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "comm/bootstrap.hpp"
#include "comm/control_plane.hpp"
#include "comm/engine.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "config/loader.hpp"
#include "daemon/checkpoint.hpp"
#include "daemon/metrics.hpp"
#include "daemon/model.hpp"
#include "daemon/optimizer.hpp"
#include "daemon/schedule.hpp"
#include "daemon/timeline.hpp"
#include "offload/device.hpp"
#include "offload/param_store.hpp"

namespace thetad::daemon {

std::atomic<int> g_stop_signal{0};

double lr_at(const config::OptimizerConfig& opt, int64_t step, int64_t total_steps) {
  if (opt.warmup_steps > 0 && step < opt.warmup_steps)
    return opt.lr * double(step + 1) / double(opt.warmup_steps);
  if (opt.lr_schedule == "cosine") {
    const double span = std::max<int64_t>(1, total_steps - opt.warmup_steps);
    const double progress = std::min(1.0, double(step - opt.warmup_steps) / span);
    return opt.min_lr + 0.5 * (opt.lr - opt.min_lr) * (1.0 + std::cos(M_PI * progress));
  }
  return opt.lr;
}

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::string hex64(uint64_t h) {
  std::ostringstream os;
  os << std::hex << std::setw(16) << std::setfill('0') << h;
  return os.str();
}

// The compatibility key of checkpoints: what fixes the parameters' names and shapes.
std::string model_hash(const config::Job& job) {
  std::string lines;
  std::istringstream in(config::fingerprint(job));
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model.", 0) == 0) lines += line + "\n";
  return hex64(comm::fnv1a64(lines));
}

// Phases of a step, marked on the compute stream.
enum class Phase : int { start, forward, backward, comm, optimizer };

// A step whose metrics wait for the device: its losses (copied back asynchronously) and, on
// GPUs, CUDA events marking its phases on the compute stream. The host reads them one step
// later (finish_step), so it never waits for the GPU inside a step and queues step s+1 while
// the GPU runs step s. On the CPU everything is final when the step returns.
struct PendingStep {
  StepRecord rec;
  std::vector<int> tasks;  // the task of each entry of losses after the first
  torch::Tensor losses;    // host float32: the step's loss, then the task losses
#if THETAD_TORCH_CUDA
  std::vector<std::pair<Phase, std::shared_ptr<at::cuda::CUDAEvent>>> marks;
  std::shared_ptr<at::cuda::CUDAEvent> done;  // losses copied
#endif
};

// The row shards of offloaded row-chunked groups (ShardSource of the model), acquired from the
// store as the model streams them and released once their compute is queued. Their gradients
// accumulate shard by shard in tensors of their own over an optimizer window; in its last
// micro-step each one is handed over (to the engine, which reduces it and copies it to the
// host) as soon as backward has queued it, so the whole gradient never exists on the device.
class StoreChunks : public ShardSource {
 public:
  using HandOver = std::function<void(int unit, torch::Tensor grad)>;
  using Throttle = std::function<void(size_t bytes)>;  // before a new gradient buffer
  StoreChunks(offload::ParamStore& store, torch::Device device, HandOver hand_over, Throttle throttle)
      : store_(store), device_(device), hand_over_(std::move(hand_over)), throttle_(std::move(throttle)) {}
  void set_step(int64_t step) { step_ = step; }
  // Whether the coming backward is the window's last (gradients are handed over in it).
  void set_last(bool last) { last_ = last; }
  torch::Tensor grad_chunk(int task, int k) override {
    torch::Tensor& g = grads_[unit(task, k)];
    if (!g.defined()) {
      const offload::UnitInfo& info = store_.unit(unit(task, k));
      throttle_(info.numel * sizeof(float));
      g = torch::zeros({static_cast<int64_t>(info.rows), static_cast<int64_t>(info.row_elems)},
                       torch::TensorOptions().dtype(torch::kFloat32).device(device_));
    }
    return g;
  }
  // Backward is done with chunk k (it got rows of gradient or none): in the window's last
  // backward the shard is handed over, or marked absent where no micro-step gave it a gradient.
  void grad_done(int task, int k) override {
    if (last_) hand_over(unit(task, k));
  }
  // The window's last micro-step computes nothing for this task (it ran in earlier ones only,
  // or it is declared with no rows): its shards are final, hand them over before backward.
  void hand_over_task(int task) {
    for (int u : store_.units_of(task + 1)) hand_over(u);
  }
  // After the last backward: what it did not hand over (none where every chunk of the window's
  // tasks reached grad_done or hand_over_task; kept as the safe default).
  void hand_over_rest() {
    while (!grads_.empty()) hand_over(grads_.begin()->first);
  }
  int num_chunks(int task) override { return static_cast<int>(store_.units_of(task + 1).size()); }
  torch::Tensor chunk(int task, int k) override {
    const int u = unit(task, k);
    const offload::UnitInfo& info = store_.unit(u);
    return torch::from_blob(store_.acquire(u, step_),
                            {static_cast<int64_t>(info.rows), static_cast<int64_t>(info.row_elems)},
                            torch::TensorOptions().dtype(torch::kFloat32).device(device_));
  }
  void done(int task, int k) override { store_.release(unit(task, k)); }

 private:
  int unit(int task, int k) const { return store_.units_of(task + 1).at(static_cast<size_t>(k)); }
  // Hands shard u's gradient of the window over, or, where it has none, an undefined tensor
  // (the engine reduces zeros for it).
  void hand_over(int u) {
    torch::Tensor g;
    auto it = grads_.find(u);
    if (it != grads_.end()) {
      g = std::move(it->second);
      grads_.erase(it);
    }
    hand_over_(u, std::move(g));
  }
  offload::ParamStore& store_;
  torch::Device device_;
  HandOver hand_over_;
  Throttle throttle_;
  int64_t step_ = 0;
  bool last_ = true;
  std::map<int, torch::Tensor> grads_;  // unit -> its gradient so far in this window
};

class Worker {
 public:
  Worker(const config::Job& job, const RunOptions& opts)
      : job_(job), opts_(opts), world_(comm::world_info()) {}

  int run();

 private:
  void build();
  void install_hooks();
  void resume();
  std::vector<uint8_t> discover_groups(const torch::Tensor& loss);
  void train_step(int64_t step, PendingStep& p);
  void optimizer_step(int64_t step, PendingStep& p);
  void mark(PendingStep& p, Phase phase);
  AdamSettings adam_settings(int64_t step) const;
  void adam_params(const std::vector<int>& params, AdamSettings s);
  void on_bucket_launch(int bucket, int contributors, comm::Work& work, float* data);
  void push_bucket(int bucket, int contributors, comm::Work& work, const float* data);
  void hand_over_shard(int unit, torch::Tensor grad);
  void hand_over_idle_shards(const StepPlan& last_plan);
  std::shared_ptr<void> grad_memory(torch::Tensor t);
  // Offloaded row-chunked groups: streamed through the engine shard by shard (one engine
  // parameter per store unit, after the model's parameters; the matrix itself has none).
  std::vector<uint8_t> streamed_;            // per group
  std::vector<std::vector<int>> shard_params_;  // per group: engine parameters of its shards
  std::vector<int> unit_param_;              // per store unit: its engine parameter (or -1)
  std::vector<size_t> grad_offset_;          // per engine parameter: element offset in its group
  // GPUs: shard gradients launched and not yet copied out (their memory is not reusable before
  // then): at most grad_inflight_cap_ bytes before a new one is allocated (throttle_grads).
  void throttle_grads(size_t bytes);
  std::mutex inflight_mu_;
  size_t grad_inflight_cap_ = 0;
  size_t grad_inflight_bytes_ = 0;
#if THETAD_TORCH_CUDA
  std::deque<std::pair<size_t, std::shared_ptr<at::cuda::CUDAEvent>>> grad_inflight_;
#endif
  void take_grad(int param);
  std::vector<uint8_t> overwrite_;        // per group: EngineOptions::overwrite
  std::vector<torch::Tensor> grad_views_;  // per resident parameter: its gradient in the bucket
  [[maybe_unused]] void step_bucket(int bucket, int contributors, comm::Work& work);
  // optimizer.overlap: resident groups are stepped bucket by bucket on opt_stream_ as their
  // allreduce lands (step_bucket, from the engine's launch); optimizer_step does the rest.
  bool overlap_opt_ = false;
  std::vector<uint8_t> bucket_stepped_;  // per bucket, this step
  AdamSettings step_settings_;           // the current step's (step count: per group)
#if THETAD_TORCH_CUDA
  std::unique_ptr<c10::cuda::CUDAStream> opt_stream_;
#endif
  void queue_losses(PendingStep& p);
  void finish_step(PendingStep& p);
  void checkpoint(int64_t completed_steps);
  bool agree_stop(int64_t step);
  comm::WorkPtr stop_work_;  // the stop agreement posted by the previous step
  int32_t stop_flag_ = 0;    // its buffer
  uint64_t params_hash();
  void progress(int64_t step, const StepRecord& rec);

  const config::Job& job_;
  RunOptions opts_;
  comm::WorldInfo world_;
  torch::Device device_{torch::kCPU};
  std::shared_ptr<comm::Communicator> comm_;  // data plane: gradients (NCCL on GPUs, else MPI)
  std::shared_ptr<comm::Communicator> ctrl_;  // control plane: stop agreement, checkpoints (MPI)
  std::unique_ptr<comm::ControlPlane> plane_;
  void* compute_stream_ = nullptr;            // cudaStream_t of the compute work, GPU runs
  void pick_device();
  int64_t device_peak_bytes();
  std::unique_ptr<TaskModel> model_;
  std::unique_ptr<DataSource> data_;
  std::unique_ptr<Schedule> schedule_;
  std::unique_ptr<comm::Engine> engine_;
  std::vector<NamedParam>* params_ = nullptr;
  std::vector<std::vector<int>> group_params_;  // group -> param indices
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_;
  std::vector<int64_t> group_steps_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keeps hooks alive
  std::unordered_map<const torch::autograd::Node*, int> acc_index_;
  std::vector<uint8_t> requires_grad_;  // current flag per group (frozen groups: 0)
  std::vector<std::pair<int, torch::Tensor>> task_losses_;  // read once per step (one sync)
  torch::Tensor loss_total_;
  std::mutex hook_error_mu_;
  std::string hook_error_;
  // Host-resident store of the task groups (offload.enabled); group 0 stays on the device.
  std::unique_ptr<offload::Device> offload_device_;
  std::unique_ptr<offload::ParamStore> store_;
  std::unique_ptr<StoreChunks> store_chunks_;  // row-chunked groups' shards, streamed by the model
  offload::StoreStats last_store_stats_;
  bool offloaded(int group) const { return store_ != nullptr && group > 0; }
  void build_store();
  void bind_group(int group, int64_t step);
  void bind_grads(int group);
  std::vector<torch::Tensor> read_store_group(int group);  // {params, exp_avg, exp_avg_sq} flat
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<Timeline> timeline_;
  int64_t start_step_ = 0;
  int64_t total_bytes_pruned_ = 0;
  Clock::time_point run_start_, last_progress_, last_done_;
  int64_t samples_since_start_ = 0;
};

// `comm.backend: auto` means NCCL when the tensors are on a GPU, MPI otherwise. The local rank
// picks the GPU.
void Worker::pick_device() {
  const auto timeout = std::chrono::milliseconds(int64_t(job_.comm.timeout_s * 1000));
  // Every rank agrees on the data plane before any of them starts one (NCCL set-up is
  // collective): `auto` where only some nodes see a GPU is an error on every rank.
  std::string plane = "mpi";
#if THETAD_TORCH_CUDA
  if (job_.comm.backend == "nccl" || (job_.comm.backend == "auto" && torch::cuda::is_available()))
    plane = torch::cuda::device_count() > 0 ? "nccl" : "nccl, but no GPU is visible";
#endif
  plane_->check_consistent("data plane (comm.backend: " + job_.comm.backend + ")", "data plane: " + plane + "\n");
  if (plane != "nccl" && plane != "mpi") throw ConfigError(job_.source + ": comm.backend: " + plane);
  const bool gpu = plane == "nccl";
#if THETAD_TORCH_CUDA
  if (gpu) {
    const int count = static_cast<int>(torch::cuda::device_count());
    const int dev = world_.local_rank % count;
    device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(dev));
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(dev));
    // Compute runs on a stream of its own, not the legacy default stream: on that one,
    // cudaStreamWaitEvent (the engine's wait for the last buckets) blocked the host until the
    // event completed, ~6 ms per step on 2×H200, so the host could not queue the next step.
    c10::cuda::setCurrentCUDAStream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false,
                                                                  static_cast<c10::DeviceIndex>(dev)));
    compute_stream_ = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(dev)).stream();
    at::globalContext().setAllowTF32CuBLAS(job_.precision == "tf32");
    at::globalContext().setAllowTF32CuDNN(job_.precision == "tf32");
    comm_ = comm::make_nccl_communicator(dev);
    comm_->set_compute_stream(compute_stream_);
  }
#endif
  if (!gpu) comm_ = ctrl_;
  comm_->set_default_timeout(timeout);
  THETAD_LOG(info, "comm") << "data plane " << comm_->backend_name() << ", device "
                           << device_.str();
}

int64_t Worker::device_peak_bytes() {
#if THETAD_TORCH_CUDA
  if (device_.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    int64_t bytes = stats.allocated_bytes[0].peak;  // aggregate over pools
    bytes += static_cast<int64_t>(engine_->buffer_bytes());
    if (store_) bytes += static_cast<int64_t>(store_->stats().device_slot_bytes);
    return bytes;
  }
#endif
  return 0;
}

void Worker::build() {
  // Every rank must run the same job: compare the settings that matter, name the first
  // differing key. First of all: ranks with different jobs must not start different collectives.
  ctrl_ = comm::make_mpi_communicator();
  ctrl_->set_default_timeout(std::chrono::milliseconds(int64_t(job_.comm.timeout_s * 1000)));
  plane_ = std::make_unique<comm::ControlPlane>(ctrl_, ctrl_->default_timeout());
  plane_->check_consistent("job", config::fingerprint(job_));
  pick_device();

  schedule_ = Schedule::create(job_, world_.size);
  // With offload, θ[t] never lives on the device whole: the model is built on the host and only
  // Θ moves to the device; the store owns θ[t] from then on.
  const bool offload = job_.offload.enabled;
  const auto t_model = Clock::now();
  model_ = make_model(job_, offload ? torch::Device(torch::kCPU) : device_, /*lazy_tasks=*/offload);
  THETAD_LOG(info, "train") << "model " << job_.model.kind << " built in " << std::fixed
                            << std::setprecision(2) << ms_since(t_model) / 1000 << " s";
  data_ = make_data(job_, *model_, device_);
  params_ = &model_->params();
  const int num_groups = static_cast<int>(job_.model.tasks) + 1;
  group_params_.assign(num_groups, {});
  std::vector<comm::ParamInfo> infos;
  for (size_t i = 0; i < params_->size(); ++i) {
    const auto& p = (*params_)[i];
    infos.push_back({p.name, static_cast<size_t>(p.tensor.numel()), p.group});
    group_params_.at(p.group).push_back(static_cast<int>(i));
  }
  // Where each gradient lands in its group's host layout (offloaded groups: registration order).
  grad_offset_.assign(infos.size(), 0);
  for (const auto& members : group_params_) {
    size_t off = 0;
    for (int p : members) {
      grad_offset_[static_cast<size_t>(p)] = off;
      off += infos[static_cast<size_t>(p)].numel;
    }
  }
  // Offloaded row-chunked groups are planned by the store's row shards, each a bucket of its
  // own; the matrix itself becomes a placeholder without a bucket.
  streamed_.assign(num_groups, 0);
  shard_params_.assign(num_groups, {});
  for (int g = 1; g < num_groups && offload; ++g) {
    if (!model_->row_chunked(g)) continue;
    streamed_[g] = 1;
    const int w = group_params_[g].at(0);
    const auto& t = (*params_)[w].tensor;
    const auto row_elems = static_cast<size_t>(t.size(1));
    infos[w].numel = 0;
    for (const auto& [r0, rows] : offload::row_shards(static_cast<size_t>(t.size(0)), row_elems,
                                                      job_.offload.shard_bytes())) {
      shard_params_[g].push_back(static_cast<int>(infos.size()));
      grad_offset_.push_back(r0 * row_elems);
      infos.push_back({(*params_)[w].name + "[" + std::to_string(r0) + ":" + std::to_string(r0 + rows) + "]",
                       rows * row_elems, g, /*alone=*/true});
    }
  }
  if (offload && !device_.is_cpu()) {
    torch::NoGradGuard no_grad;
    for (int p : group_params_[0]) {
      auto& t = (*params_)[p].tensor;
      t.set_data(t.detach().to(device_));
    }
  }
  comm::BucketPlanOptions popts;
  popts.bucket_cap_bytes = static_cast<size_t>(job_.comm.bucket_cap_mb * (1 << 20));
  popts.first_bucket_bytes = static_cast<size_t>(job_.comm.first_bucket_mb * (1 << 20));
  auto plan = comm::make_bucket_plan(infos, num_groups, popts);
  plane_->check_consistent("bucket plan", plan.describe());
  THETAD_LOG(info, "engine") << "bucket plan: " << plan.buckets.size() << " buckets over "
                             << num_groups << " groups, " << params_->size() << " parameters, hash "
                             << hex64(plan.hash);
  comm::EngineOptions eopts;
  eopts.prune = job_.comm.prune;
  eopts.average = job_.comm.average == "world" ? comm::Average::world : comm::Average::contributors;
  eopts.declared = job_.comm.active == "declared";
  eopts.timeout = comm_->default_timeout();
  if (device_.is_cuda()) {
    eopts.wait_stream = compute_stream_;
    eopts.count_comm = ctrl_;  // host flags, host result: MPI, independent of the GPU's queue
  }
#if THETAD_TORCH_CUDA
  overlap_opt_ = device_.is_cuda() && job_.optimizer.overlap && job_.optimizer.clip_norm <= 0;
  if (overlap_opt_) {
    opt_stream_ = std::make_unique<c10::cuda::CUDAStream>(
        c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index()));
  }
#endif
  if (overlap_opt_ || offload || !job_.timeline.path.empty())
    eopts.on_launch = [this](int b, int contributors, comm::Work& w, float* data) {
      on_bucket_launch(b, contributors, w, data);
    };
  if (offload) {  // θ[t]'s gradient buffers follow the active groups, not T
    eopts.grad_memory.assign(num_groups, comm::GradMemory::pooled);
    eopts.grad_memory[0] = comm::GradMemory::owned;
    for (int g = 1; g < num_groups; ++g)
      if (streamed_[g]) eopts.grad_memory[g] = comm::GradMemory::streamed;
    eopts.scratch = [this](size_t bytes) {
#if THETAD_TORCH_CUDA
      std::optional<c10::cuda::CUDAStreamGuard> on_compute;  // the stream the allreduce waits for
      if (device_.is_cuda())
        on_compute.emplace(c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(compute_stream_), device_.index()));
#endif
      throttle_grads(bytes);
      return grad_memory(torch::zeros({static_cast<int64_t>(bytes / sizeof(float))},
                                      torch::TensorOptions().dtype(torch::kFloat32).device(device_)));
    };
  }
  // Resident groups take their gradient by copy on its first arrival in a window (the hook),
  // then by accumulation, instead of a memset per step and an add. Not the pooled groups (bound
  // zeroed per window) nor row-chunked ones (their backward adds rows into the buffer itself).
  overwrite_.assign(num_groups, 0);
  for (int g = 0; g < num_groups; ++g)
    overwrite_[g] = !(offload && g > 0) && !model_->row_chunked(g);
  eopts.grad_memory.resize(num_groups, comm::GradMemory::owned);
  for (int g = 0; g < num_groups; ++g)
    if (overwrite_[g]) eopts.grad_memory[g] = comm::GradMemory::overwrite;
  engine_ = std::make_unique<comm::Engine>(comm_, std::move(plan), eopts);

  group_steps_.assign(num_groups, 0);
  requires_grad_.assign(num_groups, 1);
  exp_avg_.resize(params_->size());
  exp_avg_sq_.resize(params_->size());
  grad_views_.resize(params_->size());
  if (offload) {  // before the hooks: it moves θ[t]'s data to device placeholders
    const auto t_store = Clock::now();
    build_store();
    THETAD_LOG(info, "offload") << "host store ready in " << std::fixed << std::setprecision(2)
                                << ms_since(t_store) / 1000 << " s";
  }
  for (size_t i = 0; i < params_->size(); ++i) {
    auto& p = (*params_)[i].tensor;
    // θ[t] of the host store: gradient views are bound per step (pooled engine buffers), and
    // their Adam state lives in the host arena.
    if (offloaded((*params_)[i].group)) continue;
    // Gradients live in the engine's flat bucket buffers: .grad is a view of them.
    grad_views_[i] = torch::from_blob(engine_->grad(static_cast<int>(i)), p.sizes(),
                                      torch::TensorOptions().dtype(torch::kFloat32).device(device_));
    p.mutable_grad() = grad_views_[i];
    exp_avg_[i] = torch::zeros(p.sizes(), torch::TensorOptions().dtype(torch::kFloat32).device(device_));
    exp_avg_sq_[i] = torch::zeros(p.sizes(), torch::TensorOptions().dtype(torch::kFloat32).device(device_));
  }
  install_hooks();

  if (!job_.timeline.path.empty())
    timeline_ = std::make_unique<Timeline>(config::expand_path(job_.timeline.path, job_, world_.rank),
                                           world_.rank);
}

// From parameter i's gradient hook: the first gradient of a window in an overwrite group is a
// tensor of its own (autograd's); it is copied into the bucket, on the compute stream that the
// bucket's allreduce is ordered after, and .grad becomes the bucket view, which later
// micro-steps accumulate into.
void Worker::take_grad(int i) {
  auto& p = (*params_)[i].tensor;
  if (!overwrite_[(*params_)[i].group]) return;
  const torch::Tensor& g = p.grad();
  const torch::Tensor& view = grad_views_[i];
  if (!g.defined() || g.data_ptr() == view.data_ptr()) return;
#if THETAD_TORCH_CUDA
  std::optional<c10::cuda::CUDAStreamGuard> on_compute;
  if (device_.is_cuda())
    on_compute.emplace(c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(compute_stream_), device_.index()));
#endif
  view.copy_(g);
  p.mutable_grad() = view;
}

void Worker::install_hooks() {
  for (size_t i = 0; i < params_->size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator((*params_)[i].tensor);
    THETAD_CHECK(acc != nullptr, InternalError, "no grad accumulator for ", (*params_)[i].name);
    const int index = static_cast<int>(i);
    acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, index](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list&) {
          try {
            take_grad(index);
            engine_->mark_ready(index);
          } catch (const std::exception& e) {
            // Exceptions do not cross the autograd engine intact; rethrown after backward.
            std::lock_guard<std::mutex> lock(hook_error_mu_);
            if (hook_error_.empty()) hook_error_ = e.what();
          }
          return outputs;
        }));
    acc_index_[acc.get()] = index;
    accumulators_.push_back(std::move(acc));
  }
}

// DDP's find_unused_parameters: the groups whose parameters the loss reaches.
std::vector<uint8_t> Worker::discover_groups(const torch::Tensor& loss) {
  std::vector<uint8_t> groups(group_params_.size(), 0);
  std::vector<torch::autograd::Node*> stack;
  std::set<torch::autograd::Node*> seen;
  if (loss.grad_fn()) stack.push_back(loss.grad_fn().get());
  while (!stack.empty()) {
    auto* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    auto it = acc_index_.find(node);
    if (it != acc_index_.end()) groups[(*params_)[it->second].group] = 1;
    for (const auto& edge : node->next_edges())
      if (edge.function) stack.push_back(edge.function.get());
  }
  return groups;
}

// One optimizer step: accumulate_steps micro-steps (micro-step m of step s uses the schedule
// and data of index s*k+m); the engine reduces once, over the union of the window's groups.
void Worker::train_step(int64_t step, PendingStep& p) {
  StepRecord& rec = p.rec;
  const int64_t k = job_.accumulate_steps;
  const bool declared = job_.comm.active == "declared";
  mark(p, Phase::start);
  step_settings_ = adam_settings(step);
  bucket_stepped_.assign(engine_->plan().buckets.size(), 0);
  engine_->start_window(step);
  // Overwrite groups: autograd leaves each gradient in a tensor of its own, which take_grad
  // copies into the bucket on its first arrival in this window (see EngineOptions::overwrite).
  for (size_t i = 0; i < params_->size(); ++i)
    if (overwrite_[(*params_)[i].group]) (*params_)[i].tensor.mutable_grad().reset();
  if (store_) {
    // The previous step's gradient copies read pooled buffers that this step re-binds (and
    // zeroes on the compute stream); they started during that step's backward.
    store_->compute_after_pushes();
    std::vector<uint8_t> used(group_params_.size(), 0);
    for (int64_t m = 0; m < k; ++m) {
      const StepPlan plan = schedule_->plan(step * k + m, world_.rank);
      for (size_t g = 1; g < used.size(); ++g) used[g] |= plan.used[g];
    }
    for (size_t g = 1; g < used.size(); ++g)
      if (used[g]) {
        const int64_t t_us = Timeline::now_us();
        bind_group(static_cast<int>(g), step);
        bind_grads(static_cast<int>(g));
        if (timeline_)
          timeline_->record(Lane::h2d, "acquire θ[" + std::to_string(g - 1) + "]", t_us,
                            Timeline::now_us() - t_us, {{"group", int64_t(g)}});
      }
    store_->prefetch_for(step);
  }
  rec.task_loss.clear();
  task_losses_.clear();
  rec.forward_ms = rec.backward_ms = 0;
  torch::Tensor loss_sum;
  const int64_t batch = job_.data.batch_per_rank;
  for (int64_t m = 0; m < k; ++m) {
    const int64_t micro = step * k + m;
    const bool last = m + 1 == k;
    const StepPlan plan = schedule_->plan(micro, world_.rank);
    // Frozen groups (used in forward, not trained) get no gradient at all: requires_grad off.
    for (size_t g = 0; g < group_params_.size(); ++g) {
      const uint8_t want = plan.trained[g];
      if (want != requires_grad_[g]) {
        for (int p : group_params_[g]) (*params_)[p].tensor.requires_grad_(want != 0);
        requires_grad_[g] = want;
      }
    }
    if (declared) {
      engine_->declare_active(plan.trained);
      if (last) engine_->begin_sync();
    }
    const int64_t fwd_us = Timeline::now_us();
    auto t0 = Clock::now();
    torch::Tensor total;
    for (size_t i = 0; i < plan.tasks.size(); ++i) {
      const int task = plan.tasks[i];
      const int64_t rows = plan.task_rows[i];
      if (rows == 0) continue;
      Batch b = data_->batch(micro, world_.rank, world_.size, task, rows);
      torch::Tensor l = model_->loss(b, task, mix_seed(job_.seed, 0x5a3b1e, static_cast<uint64_t>(micro),
                                                       static_cast<uint64_t>(world_.rank) * 1000003u + task));
      task_losses_.push_back({task, l.detach()});
      torch::Tensor weighted = l * (double(rows) / double(batch * k));
      total = total.defined() ? total + weighted : weighted;
    }
    const double fwd_ms = ms_since(t0);
    rec.forward_ms += fwd_ms;
    mark(p, Phase::forward);
    if (!declared) {
      engine_->declare_active(discover_groups(total));
      if (last) engine_->begin_sync();
    }
    const int64_t bwd_us = Timeline::now_us();
    auto t1 = Clock::now();
    if (store_chunks_) {
      store_chunks_->set_last(last);
      if (last) hand_over_idle_shards(plan);
    }
    total.backward();
    {
      std::lock_guard<std::mutex> lock(hook_error_mu_);
      if (!hook_error_.empty()) throw ConfigError(hook_error_);
    }
    if (store_chunks_ && last) store_chunks_->hand_over_rest();
    // No host synchronization: on GPUs finish_backward makes the compute stream wait for the
    // last buckets (EngineOptions::wait_stream) and the marks around it time that stall.
    mark(p, Phase::backward);
    if (last) {
      if (timeline_) {  // separates the count exchange's wait from the launches that follow
        Timeline::Scope span(timeline_.get(), Lane::comm, "wait for the count exchange");
        engine_->contributors();
      }
      const int64_t t_us = Timeline::now_us();
      engine_->finish_backward();
      const int64_t mark_us = Timeline::now_us();
      mark(p, Phase::comm);
      if (timeline_) {
        const auto& st = engine_->stats();
        timeline_->record(Lane::comm, "allreduce (wait for the last buckets)", t_us,
                          Timeline::now_us() - t_us,
                          {{"buckets_launched", int64_t{st.buckets_launched}},
                           {"buckets_pruned", int64_t{st.buckets_pruned}},
                           {"bytes", int64_t{st.bytes_allreduced}},
                           {"finish_launched", int64_t{st.finish_launched}},
                           {"finish_order_ms", st.finish_order_ms},
                           {"finish_launch_ms", st.finish_launch_ms},
                           {"finish_block_ms", st.finish_block_ms},
                           {"mark_ms", double(Timeline::now_us() - mark_us) / 1000.0},
                           {"launch_call_ms", st.launch_call_ms},
                           {"on_launch_ms", st.on_launch_ms}});
      }
    }
    if (last)  // .grad is the bucket view again, also where no gradient came (zeroed there)
      for (size_t i = 0; i < params_->size(); ++i)
        if (overwrite_[(*params_)[i].group]) (*params_)[i].tensor.mutable_grad() = grad_views_[i];
    const double bwd_ms = ms_since(t1);
    rec.backward_ms += bwd_ms;
    loss_sum = loss_sum.defined() ? loss_sum + total.detach() : total.detach();
    if (timeline_) {
      timeline_->record(Lane::compute, "forward", fwd_us, int64_t(fwd_ms * 1000));
      timeline_->record(Lane::compute, last ? "backward+reduce" : "backward", bwd_us,
                        int64_t(bwd_ms * 1000),
                        {{"bytes_allreduced", int64_t{last ? engine_->stats().bytes_allreduced : 0}}});
    }
  }
  loss_total_ = loss_sum;
}

void Worker::optimizer_step(int64_t step, PendingStep& p) {
  StepRecord& rec = p.rec;
  auto t0 = Clock::now();
  const auto& contributors = engine_->contributors();
  AdamSettings s = adam_settings(step);
  rec.lr = s.lr;
  torch::NoGradGuard no_grad;
#if THETAD_TORCH_CUDA
  if (overlap_opt_) {  // the buckets' steps queued so far come before the next forward
    at::cuda::CUDAEvent opt_done;
    opt_done.record(*opt_stream_);
    opt_done.block(c10::cuda::getCurrentCUDAStream(device_.index()));
  }
#endif
  for (size_t g = 0; g < group_params_.size(); ++g) {
    // Lazy semantics: a group no rank used this step is not stepped at all.
    if (contributors[g] == 0) {
      if (offloaded(static_cast<int>(g))) store_->discard_pushes(static_cast<int>(g));
      continue;
    }
    if (offloaded(static_cast<int>(g))) {
      // Its reduced gradient went to the host bucket by bucket as the allreduces finished
      // (push_bucket); the owner clips by its norm there and steps it on the CPU.
      s.step = ++group_steps_[g];
      offload::AdamHyper h = to_hyper(s);
      h.clip_norm = job_.optimizer.clip_norm;
      const int64_t t_us = Timeline::now_us();
      store_->step_group(static_cast<int>(g), h);
      if (timeline_)
        timeline_->record(Lane::cpu_adam, "adam θ[" + std::to_string(g - 1) + "]", t_us, Timeline::now_us() - t_us);
      continue;
    }
    std::vector<int> todo;
    const comm::BucketPlan& plan = engine_->plan();
    for (int p : group_params_[g])
      if (!bucket_stepped_[plan.param_bucket[p]]) todo.push_back(p);  // else stepped as it landed
    group_steps_[g] += 1;
    if (todo.empty()) continue;
    s.step = group_steps_[g];
    const int64_t t_us = Timeline::now_us();
    adam_params(todo, s);
    if (timeline_)
      timeline_->record(Lane::compute, g == 0 ? "adam Θ" : "adam θ[" + std::to_string(g - 1) + "]",
                        t_us, Timeline::now_us() - t_us);
  }
  if (store_) store_->release_step(step);
  rec.optimizer_ms = ms_since(t0);
  mark(p, Phase::optimizer);
}

// The optimizer step of resident parameters (indices into params_), clipped by their joint norm.
void Worker::adam_params(const std::vector<int>& params, AdamSettings s) {
  std::vector<torch::Tensor> ps, gs, ms, vs;
  for (int p : params) {
    ps.push_back((*params_)[p].tensor);
    gs.push_back(grad_views_[p]);  // also where .grad is not bound yet (a bucket's early step)
    ms.push_back(exp_avg_[p]);
    vs.push_back(exp_avg_sq_[p]);
  }
  s.grad_scale = clip_scale(gs, job_.optimizer.clip_norm);
  adam_group(ps, gs, ms, vs, s);
}

AdamSettings Worker::adam_settings(int64_t step) const {
  AdamSettings s;
  s.lr = lr_at(job_.optimizer, step, job_.steps);
  s.beta1 = job_.optimizer.beta1;
  s.beta2 = job_.optimizer.beta2;
  s.eps = job_.optimizer.eps;
  s.weight_decay = job_.optimizer.weight_decay;
  s.kind = job_.optimizer.kind;
  return s;
}

// The engine launched bucket b (engine lock held, possibly on autograd's device thread).
void Worker::on_bucket_launch(int b, int contributors, comm::Work& work, float* data) {
  if (timeline_) timeline_->record(Lane::comm, "launch bucket " + std::to_string(b), Timeline::now_us(), 0);
  if (offloaded(engine_->plan().buckets[static_cast<size_t>(b)].group)) push_bucket(b, contributors, work, data);
  if (overlap_opt_) step_bucket(b, contributors, work);
}

// An offloaded group's bucket goes to the host landing area as soon as its allreduce is done,
// while the rest of backward runs: on GPUs the D2H stream waits for the bucket's work (the host
// does not), on the host device the copy follows the wait. Only the group's owner on this host
// copies; a group no rank used is not stepped, so nothing is copied for it.
void Worker::push_bucket(int b, int contributors, comm::Work& work, const float* data) {
  const comm::BucketPlan& plan = engine_->plan();
  const comm::Bucket& bucket = plan.buckets[static_cast<size_t>(b)];
  const bool copy = contributors != 0 && store_->owns(bucket.group);
  // Streamed buckets are waited for also where nothing is copied: the engine gives their
  // memory back once the work completes (host backends: once waited for).
  if (!copy && !streamed_[bucket.group]) return;
  const int64_t t_us = Timeline::now_us();
  const auto timeout = engine_->communicator().default_timeout();
  void* d2h = store_->d2h_stream();
  if (d2h) work.block_stream(d2h, timeout);
  else work.wait(timeout);
  if (copy)
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const auto p = static_cast<size_t>(bucket.params[k]);
      store_->push_grad_range(bucket.group, grad_offset_[p], data + bucket.offsets[k], plan.params[p].numel);
    }
#if THETAD_TORCH_CUDA
  if (d2h && streamed_[bucket.group]) {  // its memory is free again once the D2H stream passes here
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    done->record(c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(d2h), device_.index()));
    std::lock_guard<std::mutex> lock(inflight_mu_);
    grad_inflight_.emplace_back(bucket.numel * sizeof(float), std::move(done));
    grad_inflight_bytes_ += bucket.numel * sizeof(float);
  }
#endif
  if (!copy) return;
  if (timeline_)
    timeline_->record(Lane::d2h, "gradient θ[" + std::to_string(bucket.group - 1) + "] bucket " + std::to_string(b),
                      t_us, Timeline::now_us() - t_us, {{"bytes", int64_t(bucket.numel * sizeof(float))}});
}

// The engine holds gradient memory of its streamed groups until their bucket's work is done;
// the D2H copy that push_bucket queues may read it later still, so on GPUs the caching
// allocator is told about that stream too.
std::shared_ptr<void> Worker::grad_memory(torch::Tensor t) {
#if THETAD_TORCH_CUDA
  if (void* d2h = store_ ? store_->d2h_stream() : nullptr)
    t.record_stream(c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(d2h), device_.index()));
#endif
  auto holder = std::make_shared<torch::Tensor>(std::move(t));
  return std::shared_ptr<void>(holder, holder->data_ptr());
}

// Before a new shard gradient buffer: waits (host) for the oldest launched ones to be copied
// out while more than the cap would be in flight. Only launched ones are waited for (a bucket
// waiting for its turn to launch might wait for this very backward), so the cap is soft when
// launches lag.
void Worker::throttle_grads(size_t bytes) {
#if THETAD_TORCH_CUDA
  std::lock_guard<std::mutex> lock(inflight_mu_);
  while (!grad_inflight_.empty() &&
         (grad_inflight_.front().second->query() || grad_inflight_bytes_ + bytes > grad_inflight_cap_)) {
    grad_inflight_.front().second->synchronize();
    grad_inflight_bytes_ -= grad_inflight_.front().first;
    grad_inflight_.pop_front();
  }
#else
  (void)bytes;
#endif
}

// StoreChunks hands a shard's gradient of the window over: the engine reduces it in place.
void Worker::hand_over_shard(int unit, torch::Tensor grad) {
  const int param = unit_param_.at(static_cast<size_t>(unit));
  if (!grad.defined()) {  // no gradient in this window: later buckets need not wait for it
    engine_->mark_absent(param);
    return;
  }
  float* data = grad.data_ptr<float>();
  engine_->mark_ready(param, data, grad_memory(std::move(grad)));
}

// Before the window's last backward: the shards of groups active in this window whose task that
// backward does not compute (trained in earlier micro-steps only, declared without rows) are
// handed over now, so that their buckets do not hold up the launches until finish_backward.
void Worker::hand_over_idle_shards(const StepPlan& last_plan) {
  for (size_t g = 1; g < streamed_.size(); ++g) {
    if (!streamed_[g] || !engine_->locally_active(static_cast<int>(g))) continue;
    const int task = static_cast<int>(g) - 1;
    bool computed = false;  // backward reaches grad_done for each of its chunks
    for (size_t i = 0; i < last_plan.tasks.size(); ++i)
      computed = computed || (last_plan.tasks[i] == task && last_plan.task_rows[i] > 0 && last_plan.trained[g]);
    if (!computed) store_chunks_->hand_over_task(task);
  }
}

// optimizer.overlap (GPUs): the optimizer step of one resident bucket, on opt_stream_ once the
// bucket's allreduce has landed. Its parameters are done with for this backward: their
// gradients were final when the bucket launched, after every kernel that reads them was queued
// on the compute stream, and the allreduce waited for those. The arithmetic is the group's
// (elementwise, same step count and settings), so the parameters come out bit for bit the same.
void Worker::step_bucket(int b, int contributors, comm::Work& work) {
#if THETAD_TORCH_CUDA
  const comm::Bucket& bucket = engine_->plan().buckets[static_cast<size_t>(b)];
  const int g = bucket.group;
  // Unused groups are not stepped (lazy); unknown counts and offloaded groups: optimizer_step.
  if (contributors <= 0 || offloaded(g)) return;
  // Host time of queueing it (the timeline shows whether it holds up backward's launches).
  Timeline::Scope span(timeline_.get(), Lane::cpu_adam, "queue adam of bucket " + std::to_string(b));
  work.block_stream(opt_stream_->stream(), engine_->communicator().default_timeout());
  c10::cuda::CUDAStreamGuard on_opt(*opt_stream_);
  torch::NoGradGuard no_grad;  // thread-local: this may run on autograd's device thread
  AdamSettings s = step_settings_;
  s.step = group_steps_[g] + 1;
  adam_params(bucket.params, s);
  bucket_stepped_[static_cast<size_t>(b)] = 1;
#else
  (void)b;
  (void)contributors;
  (void)work;
#endif
}

void Worker::mark(PendingStep& p, Phase phase) {
#if THETAD_TORCH_CUDA
  if (!device_.is_cuda()) return;
  auto ev = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);  // with timing
  ev->record(c10::cuda::getCurrentCUDAStream(device_.index()));
  p.marks.emplace_back(phase, std::move(ev));
#else
  (void)p;
  (void)phase;
#endif
}

// Starts the copy of the step's losses to the host; finish_step reads them.
void Worker::queue_losses(PendingStep& p) {
  std::vector<torch::Tensor> ls{loss_total_.reshape({})};
  for (const auto& [task, l] : task_losses_) {
    ls.push_back(l.reshape({}));
    p.tasks.push_back(task);
  }
  torch::Tensor packed = torch::stack(ls).to(torch::kFloat32);
#if THETAD_TORCH_CUDA
  if (device_.is_cuda()) {
    p.losses = torch::empty({packed.numel()}, torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(true));
    p.losses.copy_(packed, /*non_blocking=*/true);
    p.done = std::make_shared<at::cuda::CUDAEvent>();
    p.done->record(c10::cuda::getCurrentCUDAStream(device_.index()));
    return;
  }
#endif
  p.losses = packed.contiguous();
}

// Waits for the step's device work (bounded by comm.timeout_s, never forever), fills in its
// losses and device times, writes its metrics and the progress line.
void Worker::finish_step(PendingStep& p) {
  StepRecord& rec = p.rec;
#if THETAD_TORCH_CUDA
  if (p.done) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(job_.comm.timeout_s);
    auto nap = std::chrono::microseconds(5);
    while (!p.done->query()) {
      if (Clock::now() > deadline)
        throw TimeoutError(detail::concat("step ", rec.step, " did not finish on ", device_.str(),
                                          " within comm.timeout_s = ", job_.comm.timeout_s, " s"));
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(50));
    }
    // Device times between consecutive marks, charged to the later mark's phase.
    rec.forward_ms = rec.backward_ms = rec.comm_wait_ms = rec.optimizer_ms = 0;
    for (size_t i = 1; i < p.marks.size(); ++i) {
      const double ms = p.marks[i - 1].second->elapsed_time(*p.marks[i].second);
      switch (p.marks[i].first) {
        case Phase::forward: rec.forward_ms += ms; break;
        case Phase::backward: rec.backward_ms += ms; break;
        case Phase::comm: rec.comm_wait_ms += ms; break;
        case Phase::optimizer: rec.optimizer_ms += ms; break;
        case Phase::start: break;
      }
    }
  }
#endif
  const float* l = p.losses.data_ptr<float>();
  rec.loss = l[0];
  for (size_t i = 0; i < p.tasks.size(); ++i) rec.task_loss.push_back({p.tasks[i], l[i + 1]});
  // Wall time per step: from the previous step's end to this one's, as the host observes it.
  const auto now = Clock::now();
  rec.step_ms = std::chrono::duration<double, std::milli>(now - last_done_).count();
  last_done_ = now;
  rec.device_mem_peak_bytes = device_peak_bytes();
  if (metrics_) metrics_->write(rec);
  progress(rec.step, rec);
}

// Pipelined: step s posts this rank's flag and step s+1 reads the sum, so no step waits on
// the control plane for the slowest rank's host. Every rank reads the same sums at the same
// steps, so all stop at the same step (one later than a blocking agreement would). The last
// step posts nothing: nothing is left in flight when the loop ends.
bool Worker::agree_stop(int64_t step) {
  bool stop = false;
  if (stop_work_) {
    stop_work_->wait(ctrl_->default_timeout());
    stop_work_.reset();
    stop = stop_flag_ > 0;
  }
  if (!stop && step + 1 < job_.steps) {
    stop_flag_ = g_stop_signal.load() ? 1 : 0;
    comm::AllreduceOptions o;
    o.tag = {"allreduce of the stop flag", step, -1};
    stop_work_ = ctrl_->allreduce(&stop_flag_, 1, comm::DType::i32, o);
  }
  return stop;
}

void Worker::checkpoint(int64_t completed) {
  if (job_.checkpoint.dir.empty()) return;
  CheckpointWriter w;
  w.dir = config::expand_path(job_.checkpoint.dir, job_, 0);
  w.step = completed;
  w.rank = world_.rank;
  w.world = world_.size;
  w.job_name = job_.name;
  w.job_hash = model_hash(job_);
  w.keep = job_.checkpoint.keep;
  w.barrier = [this, completed] { ctrl_->barrier({"checkpoint barrier", completed, -1})->wait(ctrl_->default_timeout()); };
  w.all_ok = [this, completed](bool ok) {
    int32_t bad = ok ? 0 : 1;
    comm::AllreduceOptions o;
    o.tag = {"allreduce of the checkpoint status", completed, -1};
    ctrl_->allreduce(&bad, 1, comm::DType::i32, o)->wait(ctrl_->default_timeout());
    return bad == 0;
  };
  write_checkpoint(w, static_cast<int>(group_params_.size()), [this](int g) {
    GroupState st;
    st.group = g;
    if (offloaded(g)) {
      std::vector<torch::Tensor> flat = read_store_group(g);
      int64_t off = 0;
      for (int p : group_params_[g]) {
        const auto& t = (*params_)[p].tensor;
        st.names.push_back((*params_)[p].name);
        st.params.push_back(flat[0].narrow(0, off, t.numel()).view(t.sizes()));
        st.exp_avg.push_back(flat[1].narrow(0, off, t.numel()).view(t.sizes()));
        st.exp_avg_sq.push_back(flat[2].narrow(0, off, t.numel()).view(t.sizes()));
        off += t.numel();
      }
      st.steps = group_steps_[g];
      return st;
    }
    for (int p : group_params_[g]) {
      st.names.push_back((*params_)[p].name);
      st.params.push_back((*params_)[p].tensor);
      st.exp_avg.push_back(exp_avg_[p]);
      st.exp_avg_sq.push_back(exp_avg_sq_[p]);
    }
    st.steps = group_steps_[g];
    return st;
  });
}

void Worker::build_store() {  // (validate refuses offload with sgd: the store steps Adam/AdamW)
  offload::StoreOptions so;
  so.device_slots = job_.offload.device_slots;
  so.device_budget_bytes = static_cast<size_t>(job_.offload.device_budget_mb * (1 << 20));
  so.prefetch = job_.offload.prefetch;
  so.host_limit_bytes = static_cast<size_t>(job_.offload.host_limit_mb * (1 << 20));
  so.cpu_threads = job_.offload.cpu_threads;
  so.shard_bytes = job_.offload.shard_bytes();
  so.timeout_s = job_.comm.timeout_s;
  std::vector<offload::GroupShape> shapes;
  for (size_t g = 1; g < group_params_.size(); ++g) {
    size_t n = 0;
    for (int p : group_params_[g]) n += static_cast<size_t>((*params_)[p].tensor.numel());
    if (model_->row_chunked(static_cast<int>(g))) {  // one [rows x row_elems] parameter
      const auto& t = (*params_)[group_params_[g].at(0)].tensor;
      shapes.push_back({static_cast<int>(g), static_cast<size_t>(t.size(0)), static_cast<size_t>(t.size(1))});
      continue;
    }
    shapes.push_back({static_cast<int>(g), n, 1});
  }
  if (device_.is_cuda())
    offload_device_ = offload::make_cuda_device(device_.index(), compute_stream_);
  else
    offload_device_ = std::make_unique<offload::HostDevice>();
  const Schedule* sched = schedule_.get();
  const int rank = world_.rank;
  store_ = std::make_unique<offload::ParamStore>(
      so, shapes, *offload_device_,
      [sched, rank, k = job_.accumulate_steps](int64_t step) {
        std::vector<int> groups;
        std::vector<uint8_t> used;
        for (int64_t m = 0; m < k; ++m) {
          StepPlan plan = sched->plan(step * k + m, rank);
          used.resize(plan.used.size(), 0);
          for (size_t g = 1; g < plan.used.size(); ++g) used[g] |= plan.used[g];
        }
        for (size_t g = 1; g < used.size(); ++g)
          if (used[g]) groups.push_back(static_cast<int>(g));
        return groups;
      },
      MPI_COMM_WORLD);
  for (size_t g = 1; g < group_params_.size(); ++g)
    if (model_->row_chunked(static_cast<int>(g)) && store_->units_of(static_cast<int>(g)).size() > 1 &&
        store_->slots() < 2)
      throw ConfigError(job_.source + ": offload.device_slots: row-sharded groups stream two shards at a "
                        "time (the next one's copy overlaps the current one's compute), so the store "
                        "needs at least 2 device slots; it has " + std::to_string(store_->slots()) +
                        " (raise offload.device_slots or offload.device_budget_mb)");
  unit_param_.assign(static_cast<size_t>(store_->num_units()), -1);
  for (size_t g = 1; g < group_params_.size(); ++g) {
    if (!streamed_[g]) continue;
    const auto& units = store_->units_of(static_cast<int>(g));
    THETAD_CHECK_EQ(units.size(), shard_params_[g].size(), "group ", g, ": store shards vs engine shards");
    for (size_t k = 0; k < units.size(); ++k) {
      const int p = shard_params_[g][k];
      THETAD_CHECK(store_->unit(units[k]).offset == grad_offset_[static_cast<size_t>(p)] &&
                       store_->unit(units[k]).numel == engine_->plan().params[static_cast<size_t>(p)].numel,
                   InternalError, "group ", g, " shard ", k, ": the store's unit and the engine's bucket differ");
      unit_param_[static_cast<size_t>(units[k])] = p;
    }
  }
  // Shard gradients in flight on the device: as many as the store has slots for shards.
  grad_inflight_cap_ = static_cast<size_t>(std::max<int64_t>(2, store_->slots())) * store_->slot_bytes();
  store_chunks_ = std::make_unique<StoreChunks>(
      *store_, device_, [this](int u, torch::Tensor g) { hand_over_shard(u, std::move(g)); },
      [this](size_t bytes) { throttle_grads(bytes); });
  model_->set_shard_source(store_chunks_.get());
  // Each group's owner writes its initial values straight into the arena, groups in parallel:
  // lazily built parameters draw them there (no rank holds a copy of θ), others are copied.
  store_->init_all([this](int g, float* dst) {
    torch::NoGradGuard no_grad;  // thread-local: this runs on the store's threads
    size_t off = 0;
    for (int p : group_params_[static_cast<size_t>(g)]) {
      const NamedParam& np = (*params_)[p];
      torch::Tensor view = torch::from_blob(dst + off, np.tensor.sizes(), torch::kFloat32);
      if (np.init) np.init(view);
      else view.copy_(np.tensor.detach());
      off += static_cast<size_t>(np.tensor.numel());
    }
  });
  torch::NoGradGuard no_grad;
  for (size_t g = 1; g < group_params_.size(); ++g) {
    // The model's own copy of θ[t] (or its placeholder) is dropped: a placeholder of the right
    // shape and device (one element, expanded) keeps autograd's metadata until bind_group
    // points it at a slot.
    for (int p : group_params_[g]) {
      (*params_)[p].init = nullptr;
      auto& t = (*params_)[p].tensor;
      t.set_data(torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat32).device(device_))
                     .expand(t.sizes()));
    }
  }
  THETAD_LOG(info, "offload") << "host store: " << shapes.size() << " task groups, "
                              << store_->slots() << " device slots of " << store_->slot_bytes()
                              << " bytes, host arena " << store_->arena().bytes() << " bytes";
}

// Points the parameters of an offloaded group at its device slot for this step.
void Worker::bind_group(int group, int64_t step) {
  if (model_->row_chunked(group)) {  // the model acquires its row shards as it streams them
    store_chunks_->set_step(step);
    return;
  }
  const auto& units = store_->units_of(group);
  float* base = store_->acquire(units.at(0), step);
  int64_t offset = 0;
  for (int p : group_params_[group]) {
    auto& t = (*params_)[p].tensor;
    t.set_data(torch::from_blob(base + offset, t.sizes(), t.options().requires_grad(false)));
    offset += t.numel();
  }
}

std::vector<torch::Tensor> Worker::read_store_group(int group) {
  int64_t n = 0;
  for (int p : group_params_[group]) n += (*params_)[p].tensor.numel();
  std::vector<torch::Tensor> out;
  for (int i = 0; i < 3; ++i) out.push_back(torch::empty({n}, torch::kFloat32));
  store_->read_group(group, out[0].data_ptr<float>(), out[1].data_ptr<float>(), out[2].data_ptr<float>());
  return out;
}

// Points an offloaded group's gradients at the engine's pool buffer bound to it this window.
void Worker::bind_grads(int group) {
  if (streamed_[group]) return;  // handed over shard by shard (StoreChunks)
  for (int p : group_params_[group]) {
    auto& t = (*params_)[p].tensor;
    t.mutable_grad() = torch::from_blob(engine_->grad(p), t.sizes(),
                                        torch::TensorOptions().dtype(torch::kFloat32).device(device_));
  }
}


// A fresh start sets earlier checkpoints aside (rank 0, every rank learns whether it worked);
// a resume takes the newest checkpoint that rank 0 sees, so that every rank starts at the same
// step whatever its view of a shared directory.
void Worker::resume() {
  if (job_.checkpoint.dir.empty()) return;
  const std::string dir = config::expand_path(job_.checkpoint.dir, job_, 0);
  int64_t step = -1;
  std::string error;
  if (world_.rank == 0) try {
    if (!opts_.resume) {
      const std::string aside = set_aside_checkpoints(dir);
      if (!aside.empty()) {
        THETAD_LOG(warn, "ckpt") << "--no-resume: the checkpoints already in " << dir << " were moved to "
                                 << aside << " (a later resume would otherwise pick them up)";
      }
    } else if (auto found = find_latest_checkpoint(dir)) {
      step = found->step;
    }
  } catch (const std::exception& e) {
    error = e.what();
    step = -2;
  }
  MPI_Bcast(&step, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  if (step == -2) throw Error(error.empty() ? "checkpoint: setting aside earlier checkpoints in " + dir +
                                                  " failed on rank 0"
                                            : error);
  if (step < 0) return;
  const CheckpointInfo ckpt{checkpoint_path(dir, step), step};
  torch::NoGradGuard no_grad;
  const std::string hash = model_hash(job_);
  for (size_t g = 0; g < group_params_.size(); ++g) {
    GroupState st = load_group(ckpt, static_cast<int>(g), hash);
    std::map<std::string, size_t> by_name;
    for (size_t i = 0; i < st.names.size(); ++i) by_name[st.names[i]] = i;
    std::vector<torch::Tensor> fp, fm, fv;
    for (int p : group_params_[g]) {
      auto it = by_name.find((*params_)[p].name);
      if (it == by_name.end())
        throw ConfigError(ckpt.path + ": parameter '" + (*params_)[p].name + "' missing");
      auto& t = (*params_)[p].tensor;
      if (!st.params[it->second].sizes().equals(t.sizes()))
        throw ConfigError(ckpt.path + ": parameter '" + (*params_)[p].name + "' has another shape");
      if (offloaded(static_cast<int>(g))) {
        fp.push_back(st.params[it->second].reshape({-1}));
        fm.push_back(st.exp_avg[it->second].reshape({-1}));
        fv.push_back(st.exp_avg_sq[it->second].reshape({-1}));
        continue;
      }
      t.copy_(st.params[it->second]);
      exp_avg_[p].copy_(st.exp_avg[it->second]);
      exp_avg_sq_[p].copy_(st.exp_avg_sq[it->second]);
    }
    if (offloaded(static_cast<int>(g))) {
      auto cp = torch::cat(fp).contiguous(), cm = torch::cat(fm).contiguous(), cv = torch::cat(fv).contiguous();
      store_->write_group(static_cast<int>(g), cp.data_ptr<float>(), cm.data_ptr<float>(), cv.data_ptr<float>());
    }
    group_steps_[g] = st.steps;
  }
  start_step_ = ckpt.step;
  THETAD_LOG(info, "ckpt") << "resumed from " << ckpt.path << " at step " << start_step_;
}

// FNV-1a of a parameter's bytes: chained directly for up to 16 MiB, else over the hashes of
// its 16 MiB pieces, hashed in parallel (rank 0 fingerprints 34 GB of parameters at T = 256:
// bytewise on one thread that took over a minute).
uint64_t bytes_hash(const void* data, size_t bytes, uint64_t seed) {
  constexpr size_t kPiece = size_t{16} << 20;
  const size_t pieces = (bytes + kPiece - 1) / kPiece;
  if (pieces <= 1) return comm::fnv1a64(data, bytes, seed);
  std::vector<uint64_t> hs(pieces);
  const char* base = static_cast<const char*>(data);
  at::parallel_for(0, static_cast<int64_t>(pieces), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const size_t off = static_cast<size_t>(i) * kPiece;
      hs[static_cast<size_t>(i)] = comm::fnv1a64(base + off, std::min(kPiece, bytes - off));
    }
  });
  return comm::fnv1a64(hs.data(), hs.size() * sizeof(uint64_t), seed);
}

uint64_t Worker::params_hash() {
  uint64_t h = comm::fnv1a64("", 0);
  std::vector<int64_t> store_offsets(group_params_.size(), 0);
  for (const auto& p : *params_) {
    if (offloaded(p.group)) {  // hashed where it lives: no copy of θ (T = 384: 52 GB)
      const float* values = store_->group_params(p.group) + store_offsets[static_cast<size_t>(p.group)];
      store_offsets[static_cast<size_t>(p.group)] += p.tensor.numel();
      h = bytes_hash(values, static_cast<size_t>(p.tensor.numel()) * sizeof(float), h);
      continue;
    }
    torch::Tensor c = p.tensor.detach().cpu().contiguous();
    h = bytes_hash(c.data_ptr(), static_cast<size_t>(c.numel()) * sizeof(float), h);
  }
  return h;
}

void Worker::progress(int64_t step, const StepRecord& rec) {
  if (world_.rank != 0) return;
  const double since = std::chrono::duration<double>(Clock::now() - last_progress_).count();
  const bool last = step + 1 == job_.steps;
  if (!last && since < job_.log.progress_every_s) return;
  last_progress_ = Clock::now();
  const double elapsed = std::chrono::duration<double>(Clock::now() - run_start_).count();
  const int64_t done = step + 1 - start_step_;
  const double eta = done > 0 ? elapsed / done * (job_.steps - step - 1) : 0;
  std::ostringstream os;
  os << "step " << step + 1 << "/" << job_.steps << " | "
     << std::fixed << std::setprecision(0) << (elapsed > 0 ? samples_since_start_ / elapsed : 0)
     << " samples/s | loss " << std::setprecision(4) << rec.loss;
  for (const auto& [t, l] : rec.task_loss) os << " t" << t << "=" << l;
  os << " | ETA " << std::setprecision(1) << eta << " s | pruned "
     << std::setprecision(2) << total_bytes_pruned_ / 1e6 << " MB";
  THETAD_LOG(info, "train") << os.str();
}

int Worker::run() {
  build();
  resume();
  // After resume: a resumed run appends to its metrics, a fresh one starts the file anew.
  if (!job_.metrics.path.empty() && (world_.rank == 0 || job_.metrics.all_ranks))
    metrics_ = std::make_unique<MetricsWriter>(config::expand_path(job_.metrics.path, job_, world_.rank),
                                               /*append=*/start_step_ > 0);
  run_start_ = last_progress_ = Clock::now();
  THETAD_LOG(info, "train") << "job " << job_.name << ": " << world_.size << " ranks, "
                            << job_.model.tasks << " tasks, steps " << start_step_ << ".."
                            << job_.steps;
  int exit_code = kExitOk;
  last_done_ = run_start_;
  std::unique_ptr<PendingStep> pending;  // the previous step, until its device work is read
  const auto flush = [&] {
    if (pending) {
      Timeline::Scope span(timeline_.get(), Lane::compute, "wait for the previous step's device work");
      finish_step(*pending);
    }
    pending.reset();
  };
  for (int64_t step = start_step_; step < job_.steps; ++step) {
    auto cur = std::make_unique<PendingStep>();
    StepRecord& rec = cur->rec;
    rec.step = step;
    rec.rank = world_.rank;
    train_step(step, *cur);
    {
      Timeline::Scope span(timeline_.get(), Lane::compute, "optimizer (queue)");
      optimizer_step(step, *cur);
      queue_losses(*cur);
    }
    const auto& st = engine_->stats();
    if (!device_.is_cuda()) rec.comm_wait_ms = st.comm_wait_ms;  // GPUs: device time, finish_step
    rec.count_exchange_ms = st.count_exchange_ms;
    rec.bytes_allreduced = st.bytes_allreduced;
    rec.bytes_pruned = st.bytes_pruned;
    rec.buckets_launched = st.buckets_launched;
    rec.buckets_pruned = st.buckets_pruned;
    rec.buckets_broadcast = st.buckets_broadcast;
    rec.grad_stream_peak_bytes = st.streamed_bytes_peak;
    rec.samples = job_.data.batch_per_rank;
    if (store_) {
      const offload::StoreStats ss = store_->stats();
      rec.h2d_bytes = static_cast<int64_t>(ss.h2d_bytes - last_store_stats_.h2d_bytes);
      rec.d2h_bytes = static_cast<int64_t>(ss.d2h_bytes - last_store_stats_.d2h_bytes);
      rec.swap_hits = static_cast<int64_t>(ss.swap_hits - last_store_stats_.swap_hits);
      rec.swap_misses = static_cast<int64_t>(ss.swap_misses - last_store_stats_.swap_misses);
      rec.host_pinned_bytes = static_cast<int64_t>(ss.host_pinned_bytes);
      rec.cpu_adam_ms = ss.cpu_adam_ms - last_store_stats_.cpu_adam_ms;
      rec.acquire_wait_ms = ss.acquire_wait_ms - last_store_stats_.acquire_wait_ms;
      last_store_stats_ = ss;
    }
    total_bytes_pruned_ += st.bytes_pruned;
    samples_since_start_ += job_.data.batch_per_rank * world_.size;
    // Step `step` is queued; the previous one has (nearly) finished on the device.
    flush();
    pending = std::move(cur);
    const int64_t completed = step + 1;
    bool stop = false;
    {
      Timeline::Scope span(timeline_.get(), Lane::comm, "stop agreement");
      stop = agree_stop(step);
    }
    if (stop) {
      flush();
      THETAD_LOG(warn, "train") << "stop requested (signal); checkpointing at step " << completed;
      checkpoint(completed);
      exit_code = kExitInterrupted;
      break;
    }
    if (completed == job_.steps ||
        (job_.checkpoint.every_steps > 0 && completed % job_.checkpoint.every_steps == 0)) {
      flush();
      checkpoint(completed);
    }
  }
  flush();
  if (world_.rank == 0) {
    THETAD_LOG(info, "train") << "final params hash: " << hex64(params_hash());
  }
  if (timeline_) timeline_->close();
  return exit_code;
}

}  // namespace

int run_worker(const config::Job& job, const RunOptions& opts) {
  Worker w(job, opts);
  try {
    return w.run();
  } catch (...) {
    // The job is about to be aborted (main): the worker's destructor must not wait in the
    // collective free of the host's shared window for ranks that may never join it, before
    // anyone heard of the failure. Its MPI threads still stop first (MPI_Abort hangs while a
    // thread is inside MPI).
    int size = 1;  // (not world_info(): that one is collective)
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) offload::HostArena::abandon_on_destruction();
    throw;
  }
}

}  // namespace thetad::daemon
