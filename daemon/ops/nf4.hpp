// 4-bit NormalFloat (nf4), the data type of QLoRA (Dettmers et al., 2023) for a frozen base's
// weights: each block of 64 consecutive values (of the matrix read row by row) is scaled by its
// largest magnitude (absmax) into [-1, 1], and each scaled value is replaced by the nearest of 16
// levels, the code book: quantiles of a standard normal distribution, 8 for the positive half and
// 7 for the negative one plus an exact zero, normalised so that the outermost are -1 and 1.
// The absmax is held in bf16 (rounded to nearest, and the block scaled by the rounded value), where
// QLoRA holds it in float32 or, double-quantized, in 8 bits with a float32 per 256 blocks: a value
// costs 4 bits plus 16 / 64 for its block's absmax, 0.53125 bytes (float32: 0.5625, QLoRA's double
// quantization: 0.516). bf16 keeps float32's range; its 8 bits of mantissa put the scale within
// 0.2% of the block's largest magnitude, a twentieth of the levels' smallest gap.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>

#include "daemon/ops/frozen_weight.hpp"

namespace thetad::daemon {

constexpr int64_t kNf4Block = 64;        // values per absmax
constexpr int64_t kNf4AbsmaxBytes = 2;   // bf16: 0.5 + 2 / 64 bytes a value (the plan's kNf4BytesPerValue)

// The 16 levels in ascending order (QLoRA's table, as bitsandbytes ships it).
const std::array<float, 16>& nf4_code_book();

// A matrix [rows, cols] in nf4. Its values padded with zeros to whole blocks.
struct Nf4Matrix {
  torch::Tensor codes;   // uint8 [blocks * 32]: two code-book indices a byte, the even value's in the high half
  torch::Tensor absmax;  // bf16 [blocks]: each block's largest |value|, rounded to nearest
  int64_t rows = 0, cols = 0;

  bool defined() const { return codes.defined(); }
  int64_t numel() const { return rows * cols; }
  int64_t bytes() const;  // codes and absmax
  Nf4Matrix to(torch::Device device) const;
};

// w (2-D, any float dtype, on any device) in nf4, computed where w is: each value scaled by its
// block's absmax as held, in float32 (w / bf16(absmax); a block of zeros stays zero), and given the
// nearest level's index, the lower one of two equally near (a value the rounding put past ±1, the
// outermost level's).
Nf4Matrix nf4_quantize(const torch::Tensor& w);

// The matrix's values [rows, cols] in `dtype` (bf16 or float32): code_book[code] * absmax of
// each value in float32, rounded once to bf16 (then widened, for float32), on the CPU and on
// GPUs alike. Written into the first rows * cols elements of `scratch` where it is given (of
// that dtype and device, large enough), else into new memory.
torch::Tensor nf4_dequantize(const Nf4Matrix& m, torch::ScalarType dtype, const torch::Tensor& scratch = {});

// The memory every dequantized matrix of a model is written into in turn: a GEMM queued on the
// stream reads one matrix before the next dequantization, queued after it, writes the next. Sized
// once to the largest matrix (reserve), else grown to what is asked for; a node that saved an
// earlier buffer keeps it alive.
class Nf4Scratch {
 public:
  void reserve(int64_t numel) { reserved_ = std::max(reserved_, numel); }
  torch::Tensor get(int64_t numel, torch::ScalarType dtype, torch::Device device);

 private:
  int64_t reserved_ = 0;
  torch::Tensor buffer_;
};

// Matrices in nf4 as the GEMMs of a pass read them (FrozenWeights, daemon/ops/frozen_weight.hpp),
// by the model's number for each: every acquire dequantizes into the one scratch, on the device
// the matrix is on.
class Nf4Weights final : public FrozenWeights {
 public:
  void add(int id, Nf4Matrix m);
  bool has(int id) const { return matrices_.count(id) > 0; }
  const Nf4Matrix& matrix(int id) const { return matrices_.at(id); }
  // Every matrix onto `device` (where the tokens are), once.
  void follow(torch::Device device);
  torch::Tensor acquire(int id, torch::ScalarType dtype, bool backward) override;
  void done(int id) override { (void)id; }

 private:
  std::map<int, Nf4Matrix> matrices_;
  Nf4Scratch scratch_;
};

}  // namespace thetad::daemon
