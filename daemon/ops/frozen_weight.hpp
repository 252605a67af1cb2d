// A frozen base's matrix that the model does not hold as a tensor of its own: its values are made
// just before the GEMM of forward that reads it, made again before the GEMM of the input's
// gradient in backward, and let go after each (never kept between them, so that a base larger
// than the device trains on it). Where they come from is the source's business: nf4 codes
// dequantized into a scratch (models/quantized_base.hpp), a layer streamed from host memory into
// a device slot (homes/streamed_base.hpp).
#pragma once

#include <torch/torch.h>

#include <vector>

namespace thetad::daemon {

class FrozenWeights {
 public:
  virtual ~FrozenWeights() = default;
  // GEMM id's values [out, in] in `dtype` on the device of the GEMM, valid until done(id).
  // `backward`: for the input's gradient (a pass walks its layers the other way then).
  virtual torch::Tensor acquire(int id, torch::ScalarType dtype, bool backward) = 0;
  // The GEMM that read acquire(id)'s values is queued; they may be overwritten after it.
  virtual void done(int id) = 0;
};

// One GEMM's matrix where lora_linear reads it (daemon/ops/joined_linear.hpp).
struct FrozenWeight {
  FrozenWeights* source = nullptr;
  int id = 0;
};

// One GEMM of a frozen base as the model hands it to a source: the model's number for it, its
// layer (-1: not a layer's, the output layer), the parameters whose rows it joins and their
// biases.
struct BaseGemm {
  int id;
  int layer;
  std::vector<torch::Tensor> weights, biases;
};

}  // namespace thetad::daemon
