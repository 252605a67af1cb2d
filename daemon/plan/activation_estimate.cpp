// The transformer pass's saved tensors per token (see activation_estimate.hpp).
#include "daemon/plan/activation_estimate.hpp"

#include <sstream>

namespace thetad::daemon {

ActivationEstimate transformer_activations(const config::Job& job) {
  ActivationEstimate e;
  const config::ModelConfig& m = job.model;
  if (m.kind != config::ModelKind::Transformer) return e;
  const int64_t bytes = job.precision == config::Precision::Bf16 ? 2 : 4;
  const int64_t hd = m.head_dim > 0 ? m.head_dim : m.d_model / m.heads;
  const int64_t q = m.heads * hd, kv = (m.kv_heads > 0 ? m.kv_heads : m.heads) * hd;
  const int64_t d = m.d_model, ff = m.d_ff;
  const bool gpt2 = m.arch == config::ModelArch::Gpt2;
  // Per layer, in elements of the compute dtype. Llama: the residual sum and the normed input of
  // each norm (2 x 2 d), q and the attention's output (2 q, the o projection's input is the same
  // tensor), k and v (2 kv), the gate|up output the SwiGLU saves (2 d_ff) and the down projection's
  // input (d_ff). Qwen3 adds its head norms' inputs (q + kv). gpt2: the norms' inputs and outputs
  // (4 d), q, k, v and the attention's output (4 q: no grouped heads), the up projection's output
  // and gelu's (2 d_ff).
  int64_t per_layer = gpt2 ? 4 * d + 4 * q + 2 * ff : 4 * d + 2 * q + 2 * kv + 3 * ff;
  if (m.arch == config::ModelArch::Qwen3) per_layer += q + kv;
  if (job.offload.activations) per_layer -= gpt2 ? ff : 2 * ff;  // the activation's input in host memory
  const int64_t adapters = job.model.train_shared ? 0 : job.lora.rank * static_cast<int64_t>(job.lora.targets.size());
  per_layer += adapters;  // each target's x A^T, kept for B's gradient
  const int64_t lse_bytes = m.heads * 4;  // the attention's log-sum-exp per head, float32
  e.bytes_per_token = m.layers * (per_layer * bytes + lse_bytes) + (m.vocab + d) * bytes;
  std::ostringstream s;
  s << m.layers << " layers x (" << per_layer << " values x " << bytes << " B + " << lse_bytes
    << " B) + the logits' gradient and the final norm's input (" << m.vocab + d << " x " << bytes << " B)";
  e.parts = s.str();
  return e;
}

bool joint_pass_fits(int64_t joint_bytes, int64_t free_bytes, int64_t total_bytes) {
  return joint_bytes + total_bytes / 10 <= free_bytes;
}

}  // namespace thetad::daemon
