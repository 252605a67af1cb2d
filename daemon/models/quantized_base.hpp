// A frozen base's matrices in nf4 (model.base_quant; daemon/ops/nf4.hpp) as a model holds them:
// each of its GEMMs' matrices (a projection's targets' rows joined) quantized once where the base
// was built, with its bias joined, moved to the tokens' device at the first pass, and the one
// scratch every dequantization of a pass writes into. The parameters the matrices came from keep
// their full-precision values in host memory (hold_on_host).
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "daemon/models/model.hpp"
#include "daemon/ops/nf4.hpp"

namespace thetad::daemon {

class QuantizedBase {
 public:
  // The matrix of GEMM `id` (the model's numbering): `weights`' rows joined, quantized where
  // they are; `biases` joined (empty: none).
  void add(int id, const std::vector<torch::Tensor>& weights, const std::vector<torch::Tensor>& biases) {
    torch::NoGradGuard no_grad;
    Entry& e = entries_[id];
    e.matrix = nf4_quantize(weights.size() == 1 ? weights.front().detach() : torch::cat(weights, 0));
    if (!biases.empty()) e.bias = torch::cat(biases, 0);
    scratch_.reserve(e.matrix.numel());
  }
  bool has(int id) const { return entries_.count(id) > 0; }
  // GEMM id's matrix where its input is (a QuantizedWeight for lora_linear), and its bias.
  QuantizedWeight weight(int id) const { return {&entries_.at(id).matrix, &scratch_}; }
  const torch::Tensor& bias(int id) const { return entries_.at(id).bias; }
  // GEMM id's values in dtype, in memory of their own (a node that keeps them until backward).
  torch::Tensor values(int id, torch::ScalarType dtype) const { return nf4_dequantize(entries_.at(id).matrix, dtype); }

  // Everything onto `device`, once (a base built on the host for a host store of the adapters is
  // quantized there).
  void follow(torch::Device device) {
    for (auto& [id, e] : entries_) {
      if (e.matrix.codes.device() == device) continue;
      e.matrix = e.matrix.to(device);
      if (e.bias.defined()) e.bias = e.bias.to(device);
    }
  }

 private:
  struct Entry {
    Nf4Matrix matrix;
    torch::Tensor bias;
  };
  std::map<int, Entry> entries_;
  mutable Nf4Scratch scratch_;  // a pass's, whatever const methods compute it
};

// The parameters `moved` (handles of `params`' tensors) re-pointed at a host copy of their values
// and marked NamedParam::host_only: checkpoints, the final hash and the merged export read them
// there; the device keeps the quantized copy alone.
inline void hold_on_host(std::vector<NamedParam>& params, const std::vector<torch::Tensor>& moved) {
  torch::NoGradGuard no_grad;
  std::vector<const c10::TensorImpl*> impls;
  for (torch::Tensor t : moved) {  // a handle of the parameter's TensorImpl: set_data reaches every holder
    t.set_data(t.detach().to(torch::kCPU));
    impls.push_back(t.unsafeGetTensorImpl());
  }
  for (NamedParam& p : params)
    if (std::find(impls.begin(), impls.end(), p.tensor.unsafeGetTensorImpl()) != impls.end()) p.host_only = true;
}

}  // namespace thetad::daemon
