// Rotary positions (see rotary.hpp).
#include "daemon/ops/rotary.hpp"

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

namespace {

// The rotation as one autograd node of three kernels each way (x c, then each half's product
// with sin added in place), where the formula's ops are five and keep x and rotate_half(x) for
// backward: the rotation needs neither (its derivative is the rotation by -angle). With c = cos,
// s = sin (both halves alike): out1 = x1 c - x2 s, out2 = x2 c + x1 s; dx1 = g1 c + g2 s,
// dx2 = g2 c - g1 s.
struct RotateFn : torch::autograd::Function<RotateFn> {
  static torch::Tensor turn(const torch::Tensor& x, const torch::Tensor& c, const torch::Tensor& s, double sign) {
    const int64_t half = x.size(-1) / 2;
    const torch::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
    const torch::Tensor sh = s.narrow(-1, 0, half);
    torch::Tensor out = x * c;
    out.narrow(-1, 0, half).addcmul_(x2, sh, -sign);
    out.narrow(-1, half, half).addcmul_(x1, sh, sign);
    return out;
  }
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& c,
                               const torch::Tensor& s) {
    ctx->save_for_backward({c, s});
    return turn(x, c, s, 1.0);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    return {turn(grad_outputs.at(0), saved[0], saved[1], -1.0), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor RotaryTables::rotate(const torch::Tensor& x) const {
  const int64_t seq = x.size(2);
  const torch::Tensor c = cos.narrow(0, 0, seq).to(x.scalar_type()), s = sin.narrow(0, 0, seq).to(x.scalar_type());
  return RotateFn::apply(x, c, s);
}

}  // namespace thetad::daemon
