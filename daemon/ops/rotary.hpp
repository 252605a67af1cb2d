// The rotary positions of the llama-family transformer (daemon/models/transformer.cpp), as Hugging
// Face computes them: the inverse frequencies of a head (plain, or remapped as Llama 3.1's
// rope_scaling "llama3" does), their angles at each position, and the rotation of queries and keys.
#pragma once

#include <torch/torch.h>

#include "config/job.hpp"

namespace thetad::daemon {

// inv_freq [head_size / 2], float32 on the CPU: 1 / rope_theta^(2i / head_size), and with
// model.rope_scaling llama3 each frequency of wavelength 2π / f above
// rope_original_max_positions / rope_low_freq_factor divided by rope_factor, those below
// rope_original_max_positions / rope_high_freq_factor kept, and those between blended by
// s = (rope_original_max_positions / wavelength - low) / (high - low):
// (1 - s) f / rope_factor + s f.
torch::Tensor rotary_inv_freq(const config::ModelConfig& m);

// The tables a head's rotation reads: cos and sin [seq_len, head_size] (float32, on `device`) of
// position x inv_freq, each frequency's angle repeated for both halves of the head.
struct RotaryTables {
  torch::Tensor cos, sin;

  RotaryTables() = default;
  RotaryTables(const config::ModelConfig& m, torch::Device device);
  // x cos + rotate_half(x) sin over x [rows, heads, seq, head_size], rotate_half(x) = (-x2, x1),
  // in x's dtype.
  torch::Tensor rotate(const torch::Tensor& x) const;
};

}  // namespace thetad::daemon
