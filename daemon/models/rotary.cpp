// Rotary positions (see rotary.hpp).
#include "daemon/models/rotary.hpp"

#include <cmath>

namespace thetad::daemon {

torch::Tensor rotary_inv_freq(const config::ModelConfig& m) {
  const int64_t dh = m.head_size();
  // In float32 as Hugging Face computes it: theta ^ (arange(0, dh, 2) / dh), then its reciprocal.
  const torch::Tensor exponent = torch::arange(0, dh, 2, torch::kInt64).to(torch::kFloat32) / double(dh);
  const torch::Tensor inv_freq = torch::pow(m.rope_theta, exponent).reciprocal();
  if (m.rope_scaling != config::RopeScaling::Llama3) return inv_freq;
  // Llama 3.1's remapping, in float32 too; a scalar over a tensor is its reciprocal times the
  // scalar, as torch's `scalar / tensor` is.
  const double factor = m.rope_factor, low = m.rope_low_freq_factor, high = m.rope_high_freq_factor;
  const double context = double(m.rope_original_max_positions);
  const double low_freq_wavelen = context / low, high_freq_wavelen = context / high;
  const torch::Tensor wavelen = inv_freq.reciprocal() * (2 * M_PI);
  const torch::Tensor scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
  const torch::Tensor smooth = (wavelen.reciprocal() * context - low) / (high - low);
  const torch::Tensor smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
  const torch::Tensor medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return torch::where(medium, smoothed, scaled);
}

RotaryTables::RotaryTables(const config::ModelConfig& m, torch::Device device) {
  const torch::Tensor inv_freq = rotary_inv_freq(m);
  const torch::Tensor pos = torch::arange(m.seq_len, torch::kInt64).to(torch::kFloat32);
  const torch::Tensor angles = pos.unsqueeze(1) * inv_freq.unsqueeze(0);
  const torch::Tensor both = torch::cat({angles, angles}, -1);
  cos = both.cos().to(device);
  sin = both.sin().to(device);
}

torch::Tensor RotaryTables::rotate(const torch::Tensor& x) const {
  const int64_t seq = x.size(2), half = x.size(3) / 2;
  const torch::Tensor c = cos.narrow(0, 0, seq).to(x.scalar_type()), s = sin.narrow(0, 0, seq).to(x.scalar_type());
  const torch::Tensor rot = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * c + rot * s;
}

}  // namespace thetad::daemon
