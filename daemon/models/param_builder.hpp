// Building the built-in models' parameters (internal to daemon/models/ and daemon/data/):
// generators, the ParamBuilder that registers named parameters with their groups and draws their
// values, and the Linear layer. Every value is a function of (init seed, group, index in the
// group), so every rank, device and resumed run gets the same parameters whatever else the model
// has.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>
#if THETAD_TORCH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "common/thread_pool.hpp"
#include "config/job.hpp"
#include "daemon/models/model.hpp"
#include "daemon/ops/precision.hpp"
#include "daemon/plan/placement.hpp"

namespace thetad::daemon::detail {

inline at::Generator generator(uint64_t seed) { return at::detail::createCPUGenerator(seed); }

// Batches are drawn where the model runs: no host-side generation or copy in the step on GPUs.
inline at::Generator generator_on(uint64_t seed, torch::Device device) {
#if THETAD_TORCH_CUDA
  if (device.is_cuda()) {
    auto gen = at::cuda::detail::createCUDAGenerator(device.index());
    gen.set_current_seed(seed);
    return gen;
  }
#endif
  (void)device;
  return generator(seed);
}

inline uint64_t init_seed(const config::Job& job) {
  return job.model.init_seed >= 0 ? static_cast<uint64_t>(job.model.init_seed) : job.seed;
}

// How forward reads a parameter of Θ: only through autocast's casts (linear, matmul, addmm), so
// that a frozen base may hold it in bf16 (Placement::frozen_base_bf16), or otherwise (float32 always;
// a model may hold one it reads widened in bf16 where its values are bf16 already).
enum class Read { any, autocast };

// Helper that registers parameters with names and groups. Values: U(-bound, bound) (a Linear
// layer's: 1/sqrt(in), like torch.nn.Linear), drawn on the CPU from a generator of the
// parameter's own, so that every rank and device gets the same values whatever the order, held
// as the parameter's dtype (bf16: the float32 draw rounded, as autocast's cast would round it).
// They are drawn when the builder goes out of scope, in parallel over parameters, and copied to
// the model's device by the thread that drew them: 1,024 heads of 2 M parameters drawn one after
// another took 8.7 s of an H100 job's start-up, and T = 256 heads of 33.6 M minutes.
// With `lazy` (CPU only), task parameters (group > 0) are not drawn at all: they are
// placeholders with an init function (NamedParam::init) that draws the same values later; so
// are the matrices of a drawn base that model.base_quant quantizes (the model draws them as it
// quantizes them, a 70 B base never whole in any memory) or offload.shared: stream streams (drawn
// straight into the host memory they are streamed from).
class ParamBuilder {
 public:
  ParamBuilder(const config::Job& job, const Placement& place, torch::Device device, std::vector<NamedParam>& out,
               bool lazy = false)
      : seed_(init_seed(job)), device_(device), out_(out), lazy_(lazy && device.is_cpu()),
        base_bf16_(place.frozen_base_bf16), shared_from_file_(!job.model.init_from.empty()),
        drawn_later_(place.drawn_quantized_base || (place.streamed_base && job.model.init_from.empty())) {}
  ParamBuilder(const ParamBuilder&) = delete;
  ParamBuilder& operator=(const ParamBuilder&) = delete;
  // Draws the deferred values (see the class comment), in parallel on the process's pool (idle
  // while the model is built), not at::parallel_for: the intra-op pool drew 2,048 heads one after
  // another on the GPU image (8 s of start-up at 1,024 tasks). Throws what a draw or copy threw
  // (not while the stack unwinds).
  ~ParamBuilder() noexcept(false) {
    try {
      ThreadPool::instance().parallel_for(deferred_.size(), [&](size_t i) {
        torch::NoGradGuard no_grad;  // thread-local: in-place fills of leaves that require grad
        draw(deferred_[i]);
      }, kDrawThreads);
    } catch (...) {
      if (std::uncaught_exceptions() == 0) throw;
    }
  }
  // Linear's weight and bias: read by addmm only (Linear, trunk_layer).
  torch::Tensor linear_w(const std::string& name, int group, int64_t in, int64_t out) {
    return add(name + ".weight", group, {out, in}, 1.0 / std::sqrt(double(in)), Read::autocast);
  }
  torch::Tensor linear_b(const std::string& name, int group, int64_t in, int64_t out) {
    return add(name + ".bias", group, {out}, 1.0 / std::sqrt(double(in)), Read::autocast);
  }
  torch::Tensor add(const std::string& name, int group, std::vector<int64_t> sizes, double bound, Read read = Read::any) {
    const uint64_t seed = next_seed(group);
    if (lazy_ && group > 0)
      return put(name, group, placeholder(sizes),
                 [bound, seed](torch::Tensor& d) { d.uniform_(-bound, bound, generator(seed)); });
    const auto dtype = group == 0 && read == Read::autocast && base_bf16_ ? torch::kBFloat16 : torch::kFloat32;
    // A drawn base quantized at load (model.base_quant) or streamed: drawn only where it is
    // quantized (and for the final hash) or streamed from, its values as held (rounded to bf16
    // where that is the dtype).
    if (group == 0 && read == Read::autocast && drawn_later_)
      return put(name, group, placeholder(sizes), [bound, seed, dtype](torch::Tensor& d) {
        d.copy_(torch::empty(d.sizes(), torch::kFloat32).uniform_(-bound, bound, generator(seed)).to(dtype));
      });
    torch::Tensor t;
    if (group == 0 && shared_from_file_) {
      // model.init_from gives every shared parameter (a missing one is exit 2): nothing to draw
      // (a 1 B-parameter base drawn and then overwritten would cost seconds of start-up).
      t = torch::empty(sizes, torch::TensorOptions().dtype(dtype).device(device_)).set_requires_grad(true);
    } else {
      t = torch::empty(sizes, torch::TensorOptions().dtype(dtype).device(device_)).set_requires_grad(true);
      deferred_.push_back({t, bound, seed});
    }
    return put(name, group, t);
  }
  // A [rows x (cols+1)] parameter: a U(-bound, bound) weight with the bias (same bound) as its
  // last column, drawn from the group's next two seeds (weight, then bias).
  torch::Tensor add_weight_bias(const std::string& name, int group, int64_t rows, int64_t cols, double bound) {
    const uint64_t ws = next_seed(group), bs = next_seed(group);
    ParamInit init = [=](torch::Tensor& d) {
      torch::NoGradGuard no_grad;
      d.narrow(1, 0, cols).copy_(torch::empty({rows, cols}, torch::kFloat32).uniform_(-bound, bound, generator(ws)));
      d.select(1, cols).copy_(torch::empty({rows}, torch::kFloat32).uniform_(-bound, bound, generator(bs)));
    };
    if (lazy_ && group > 0) return put(name, group, placeholder({rows, cols + 1}), std::move(init));
    torch::Tensor t = torch::empty({rows, cols + 1}, torch::kFloat32);
    init(t);
    return put(name, group, t.to(device_).set_requires_grad(true));
  }
  // A parameter of Θ with every element `value` (LayerNorm's scale and shift).
  torch::Tensor add_filled(const std::string& name, int group, std::vector<int64_t> sizes, double value) {
    THETAD_CHECK(group == 0, InternalError, "add_filled is for shared parameters, got group ", group);
    return put(name, group, torch::full(sizes, value, torch::kFloat32).to(device_).set_requires_grad(true));
  }
  torch::Tensor put(const std::string& name, int group, torch::Tensor t, ParamInit init = {}) {
    out_.push_back({name, t, group, std::move(init)});
    return t;
  }

 private:
  // At most this many threads draw (the copies to a GPU stop gaining beyond it).
  static constexpr size_t kDrawThreads = 32;
  struct Deferred {
    torch::Tensor tensor;
    double bound;
    uint64_t seed;
  };
  // Float32 on the CPU: in place; otherwise drawn there in float32, then rounded and/or copied.
  static void draw(Deferred& d) {
    if (d.tensor.is_cpu() && d.tensor.scalar_type() == torch::kFloat32) {
      d.tensor.uniform_(-d.bound, d.bound, generator(d.seed));
      return;
    }
    d.tensor.copy_(torch::empty(d.tensor.sizes(), torch::kFloat32).uniform_(-d.bound, d.bound, generator(d.seed)));
  }
  uint64_t next_seed(int group) {
    const int index_in_group = counts_[group]++;
    return mix_seed(seed_, static_cast<uint64_t>(group), index_in_group);
  }
  // Shape and autograd metadata only: one zero, expanded.
  static torch::Tensor placeholder(const std::vector<int64_t>& sizes) {
    return torch::zeros({1}, torch::kFloat32).expand(sizes).detach().set_requires_grad(true);
  }
  std::vector<Deferred> deferred_;
  uint64_t seed_;
  torch::Device device_;
  std::vector<NamedParam>& out_;
  bool lazy_;
  bool base_bf16_;         // Placement::frozen_base_bf16: Θ's Read::autocast parameters are held in bf16
  bool shared_from_file_;  // model.init_from: Θ's values come from the file, not drawn
  bool drawn_later_;       // a drawn base quantized or streamed: Θ's matrices are placeholders
  std::map<int, int> counts_;
};

struct Linear {
  torch::Tensor w, b;
  torch::Tensor operator()(const torch::Tensor& x) const { return torch::addmm(b, x, w.t()); }
};

inline Linear make_linear(ParamBuilder& pb, const std::string& name, int group, int64_t in, int64_t out) {
  Linear l;
  l.w = pb.linear_w(name, group, in, out);
  l.b = pb.linear_b(name, group, in, out);
  return l;
}

}  // namespace thetad::daemon::detail
