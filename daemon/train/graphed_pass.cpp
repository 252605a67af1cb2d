// GraphedPass (see graphed_pass.hpp).
#include "daemon/train/graphed_pass.hpp"

#include <torch/version.h>

#include <algorithm>
#include <optional>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/test_hooks.hpp"

#define THETAD_CUDA_GRAPHS (THETAD_TORCH_CUDA && TORCH_VERSION_MAJOR >= 2)
#if THETAD_CUDA_GRAPHS
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace thetad::daemon {

// One shape's pass: its slots, the inputs it reads (filled before every run), what it leaves
// (each part's loss, the slots' gradients) and, captured, its graph.
struct GraphedPass::Shape {
  std::unique_ptr<SlotPass> pass;
  torch::Tensor x;
  std::vector<torch::Tensor> ys;
  std::vector<torch::Tensor> losses, grads;
  std::vector<double> weights;  // those the graph was captured with
#if THETAD_CUDA_GRAPHS
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
};

GraphedPass::GraphedPass(TaskModel& model, ParamGroups& groups, GradHooks& hooks, const DataPlane& data, bool capture)
    : model_(model), groups_(groups), hooks_(hooks), data_(data), capture_(capture) {
#if !THETAD_CUDA_GRAPHS
  THETAD_CHECK(!capture, InternalError, "CUDA graphs need a CUDA LibTorch 2.x");
#endif
  for (size_t p = 0; p < groups_.size(); ++p) param_of_[groups_[static_cast<int>(p)].name] = static_cast<int>(p);
}

GraphedPass::~GraphedPass() = default;

std::vector<torch::Tensor> GraphedPass::forward(const PassInputs& in, const std::vector<double>& weights) {
  last_ = nullptr;
  if (in.parts.empty()) return {};
  const int64_t rows = in.rows.front();
  if (std::any_of(in.rows.begin(), in.rows.end(), [&](int64_t r) { return r != rows; })) return {};
  const auto key = std::make_pair(static_cast<int>(in.parts.size()), rows);
  auto it = shapes_.find(key);
  if (it == shapes_.end()) {
    auto s = std::make_unique<Shape>();
    s->pass = model_.slot_pass(key.first, rows);  // nullptr: never graphed, remembered as such
    it = shapes_.emplace(key, std::move(s)).first;
  }
  Shape& s = *it->second;
  if (!s.pass) return {};
  // A graph replays the weights it was captured with: another window's weights (another
  // accumulate_steps or batch split) take the plain path.
  if (!s.weights.empty() && s.weights != weights) return {};

  std::vector<int> tasks;
  std::vector<torch::Tensor> xs;
  for (const TaskRows& p : in.parts) {
    tasks.push_back(p.task);
    xs.push_back(p.batch->x);
  }
  data_.on_compute_stream([&] {
    {
      torch::NoGradGuard no_grad;
      if (!s.x.defined()) {
        s.x = torch::cat(xs);
        for (const TaskRows& p : in.parts) s.ys.push_back(p.batch->y.clone());
      } else {
        torch::cat_out(s.x, xs);
        for (size_t i = 0; i < in.parts.size(); ++i) s.ys[i].copy_(in.parts[i].batch->y);
      }
    }
    s.pass->bind(tasks);
    if (!capture_) {
      run(s, weights);
      return;
    }
#if THETAD_CUDA_GRAPHS
    if (!s.graph) capture(s, weights);
    s.graph->replay();
#endif
  });
  last_ = &s;
  last_tasks_ = tasks;
  // The records read the losses a step later; the next replay overwrites the graph's own.
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& l : s.losses) out.push_back(l.detach().clone());
  return out;
}

// The pass and its gradients as autograd computes them: what a capture records.
void GraphedPass::run(Shape& s, const std::vector<double>& weights) {
  const std::vector<torch::Tensor> losses = s.pass->losses(s.x, s.ys);
  torch::Tensor total;
  for (size_t i = 0; i < losses.size(); ++i) {
    torch::Tensor w = losses[i] * weights[i];
    total = total.defined() ? total + w : w;
  }
  s.grads = torch::autograd::grad({total}, s.pass->slots());
  // Each part's gradient contiguous (a joined adapter's B comes back as columns of a wider
  // gradient): delivered, it is adopted as it is, where a strided one would be copied per task.
  for (torch::Tensor& g : s.grads)
    if (!g.is_contiguous()) g = g.contiguous();
  s.losses.clear();
  for (const torch::Tensor& l : losses) s.losses.push_back(l.detach());
}

// Two plain runs first (cuBLAS's workspaces, autograd's first use of the stream), then the
// capture on the compute stream, the current one here. The graph's memory pool keeps the
// activations and the outputs for every replay.
void GraphedPass::capture(Shape& s, const std::vector<double>& weights) {
#if THETAD_CUDA_GRAPHS
  for (int i = 0; i < 2; ++i) run(s, weights);
  // Autocast keeps the bf16 casts of leaves that require grad (the slots) until its scope ends:
  // a cast cached by the runs above would be read, not made, by the graph, and every replay
  // would see the slots of the capture.
  at::autocast::clear_cache();
  // The graph's pool cannot take blocks the allocator caches for plain runs: the runs' activations,
  // freed, stay reserved beside the graph's own unless given back first (as torch.cuda.graph does).
  // Without this an 8 B base's joint pass of 8,192 tokens ran out of an 80 GB GPU with 40 GiB
  // reserved and unused, where the same pass without a graph peaks at 59 GiB.
  c10::cuda::device_synchronize();
  c10::cuda::CUDACachingAllocator::emptyCache();
  s.graph = std::make_unique<at::cuda::CUDAGraph>();
  s.graph->capture_begin();
  run(s, weights);
  s.graph->capture_end();
  at::autocast::clear_cache();
  s.weights = weights;
  ++captures_;
  THETAD_LOG(info, "train") << "train.cuda_graphs: captured a pass of " << s.ys.size() << " tasks x " << s.x.size(0) / static_cast<int64_t>(s.ys.size())
                            << " rows (forward and backward, replayed as one graph)";
#else
  (void)s;
  (void)weights;
#endif
}

// A task's parameter index per slot, resolved by name once: a step hands over thousands of
// gradients (1.1 B Llama, 8 tasks: 2,464), and the host is what delivers them.
const std::vector<int>& GraphedPass::slot_params(const Shape& s, int task) {
  std::vector<int>& params = slot_params_[task];
  if (!params.empty()) return params;
  for (const std::string& name : s.pass->slot_params(task)) {
    const auto it = param_of_.find(name);
    THETAD_CHECK(it != param_of_.end(), InternalError, "a slot's gradient for '", name, "', which is no parameter");
    params.push_back(it->second);
  }
  return params;
}

void GraphedPass::backward(bool last) {
  THETAD_CHECK(last_ != nullptr, InternalError, "GraphedPass::backward without a forward");
  std::vector<std::pair<int, torch::Tensor>> grads;
  for (size_t i = 0; i < last_tasks_.size(); ++i) {
    const std::vector<int>& params = slot_params(*last_, last_tasks_[i]);
    for (size_t leaf = 0; leaf < params.size(); ++leaf)
      grads.emplace_back(params[leaf], last_->grads.at(leaf).select(0, static_cast<int64_t>(i)));
  }
  // Backward's order (the reverse of registration): the buckets fill as they would.
  std::sort(grads.begin(), grads.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  hooks_.deliver(grads, last);
  last_ = nullptr;
}

std::unique_ptr<GraphedPass> make_graphed_pass(const config::Job& job, const Placement& placement, TaskModel& model,
                                               ParamGroups& groups, GradHooks& hooks, const DataPlane& data) {
  const bool applies = job.train.cuda_graphs && job.comm.active == config::Active::Declared &&
                       !job.offload.activations && placement.shared == HomeKind::resident &&
                       !placement.streamed_base && model.fuses_tasks();
  if (!applies) return nullptr;
  const bool capture = data.gpu() && THETAD_CUDA_GRAPHS;
  if (!capture && (data.gpu() || !test_hooks::slot_pass_without_graph())) return nullptr;
  THETAD_LOG(info, "train") << "train.cuda_graphs: passes of equal rows read their tasks' parameters from slots"
                            << (capture ? ", each shape captured once as a CUDA graph and replayed"
                                        : " (a test aid: without a graph)");
  return std::make_unique<GraphedPass>(model, groups, hooks, data, capture);
}

}  // namespace thetad::daemon
