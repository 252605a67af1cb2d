// A frozen base's matrices in nf4 (model.base_quant; daemon/ops/nf4.hpp) as a model holds them:
// each of its GEMMs' matrices (a projection's targets' rows joined) quantized once on the model's
// device, moved to the tokens' device at the first pass, and the one scratch every
// dequantization of a pass writes into. The parameters the matrices came from keep their
// full-precision values in host memory, or none (a drawn base's placeholders).
#pragma once

#include <torch/torch.h>

#include <map>
#include <utility>
#include <vector>

#include "daemon/models/model.hpp"
#include "daemon/ops/frozen_weight.hpp"
#include "daemon/ops/nf4.hpp"

namespace thetad::daemon {

// The placeholders of a drawn base among a model's parameters (NamedParam::init), by tensor.
using DrawnParams = std::map<const c10::TensorImpl*, const NamedParam*>;
DrawnParams drawn_params(const std::vector<NamedParam>& params);

// One GEMM's matrix (its weights' rows joined) in nf4, computed on `device`: a weight that is a
// placeholder (`drawn`) drawn on the CPU and cast there to `held`, the others as the model holds
// them. The same codes wherever the matrix is held afterwards (resident, or streamed from host
// memory: homes/streamed_base.hpp).
Nf4Matrix quantize_gemm(const BaseGemm& gemm, const DrawnParams& drawn, torch::Device device, torch::ScalarType held);

class QuantizedBase {
 public:
  // Every GEMM quantized on `device`, in parallel over GEMMs: a weight that is a placeholder of
  // `params` (a drawn base: NamedParam::init) is drawn there and then on the CPU, as `held`
  // (the dtype the model would hold it in: the same values), and dropped once quantized. Then the
  // weights' parameters are re-pointed at host copies of their values (placeholders stay as they
  // are) and marked NamedParam::host_only: checkpoints, the final hash and the merged export read
  // them there; the device keeps the quantized copy alone.
  void quantize(const std::vector<BaseGemm>& gemms, std::vector<NamedParam>& params, torch::Device device,
                torch::ScalarType held);
  bool has(int id) const { return weights_.has(id); }
  // The matrices as the GEMMs read them (each acquire dequantizes into the one scratch).
  FrozenWeights& weights() { return weights_; }
  // GEMM id's values in dtype, in memory of their own (a node that keeps them until backward).
  torch::Tensor values(int id, torch::ScalarType dtype) const { return nf4_dequantize(weights_.matrix(id), dtype); }
  // Everything onto `device`, once (a base built on the host for a host store of the adapters is
  // quantized there).
  void follow(torch::Device device) { weights_.follow(device); }

 private:
  Nf4Weights weights_;
};

}  // namespace thetad::daemon
