// The quantized base (see quantized_base.hpp).
#include "daemon/models/quantized_base.hpp"

#include <algorithm>

#include "common/thread_pool.hpp"

namespace thetad::daemon {
namespace {

// At most this many GEMMs quantized at once (each holds its matrix on the device meanwhile).
constexpr size_t kQuantizeThreads = 8;

// The parameters `moved` (handles of `params`' tensors) re-pointed at host copies of their values
// (set_data reaches every holder of the parameter) and marked host_only.
void hold_on_host(std::vector<NamedParam>& params, const std::vector<torch::Tensor>& moved) {
  torch::NoGradGuard no_grad;
  std::vector<const c10::TensorImpl*> impls;
  for (torch::Tensor t : moved) {
    t.set_data(t.detach().to(torch::kCPU));
    impls.push_back(t.unsafeGetTensorImpl());
  }
  for (NamedParam& p : params)
    if (std::find(impls.begin(), impls.end(), p.tensor.unsafeGetTensorImpl()) != impls.end()) p.host_only = true;
}

}  // namespace

DrawnParams drawn_params(const std::vector<NamedParam>& params) {
  DrawnParams drawn;
  for (const NamedParam& p : params)
    if (p.group == 0 && p.init) drawn[p.tensor.unsafeGetTensorImpl()] = &p;
  return drawn;
}

Nf4Matrix quantize_gemm(const BaseGemm& gemm, const DrawnParams& drawn, torch::Device device, torch::ScalarType held) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> values;
  for (const torch::Tensor& w : gemm.weights) {
    const auto it = drawn.find(w.unsafeGetTensorImpl());
    values.push_back(it == drawn.end() ? w.detach().to(device) : it->second->drawn().to(device, held));
  }
  return nf4_quantize(values.size() == 1 ? values.front() : torch::cat(values, 0));
}

void QuantizedBase::quantize(const std::vector<BaseGemm>& gemms, std::vector<NamedParam>& params, torch::Device device,
                             torch::ScalarType held) {
  const DrawnParams drawn = drawn_params(params);
  std::vector<Nf4Matrix> quantized(gemms.size());
  ThreadPool::instance().parallel_for(gemms.size(), [&](size_t i) {
    quantized[i] = quantize_gemm(gemms[i], drawn, device, held);
  }, kQuantizeThreads);
  std::vector<torch::Tensor> moved;
  for (size_t i = 0; i < gemms.size(); ++i) {
    weights_.add(gemms[i].id, std::move(quantized[i]));
    moved.insert(moved.end(), gemms[i].weights.begin(), gemms[i].weights.end());
  }
  hold_on_host(params, moved);
}

}  // namespace thetad::daemon
