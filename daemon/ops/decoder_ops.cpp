// Norms and attention of the transformer (see decoder_ops.hpp).
#include "daemon/ops/decoder_ops.hpp"

#include <torch/version.h>

#include <cmath>
#include <limits>

namespace thetad::daemon {

torch::Tensor block_norm(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& b, bool rms, double eps) {
  const torch::Tensor h32 = h.to(torch::kFloat32);
  if (!rms) return torch::layer_norm(h32, {h32.size(-1)}, w, b, eps);
#if THETAD_TORCH_CUDA && (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8))
  // One fused kernel each way on GPUs, where the formula is five passes over the activations.
  if (h32.is_cuda()) return at::rms_norm(h32, {h32.size(-1)}, w, eps);
#endif
  return w * (h32 * torch::rsqrt(h32.pow(2).mean(-1, /*keepdim=*/true) + eps));
}

torch::Tensor head_rms_norm(const torch::Tensor& x, const torch::Tensor& w, int64_t head_size, double eps) {
  const torch::Tensor h32 = x.view({x.size(0), x.size(1), -1, head_size}).to(torch::kFloat32);
  return (w * (h32 * torch::rsqrt(h32.pow(2).mean(-1, /*keepdim=*/true) + eps))).view(x.sizes());
}

namespace {

// Each key/value head repeated for the heads / kv_heads query heads that share it.
torch::Tensor repeat_kv(const torch::Tensor& t, int64_t heads) {
  return t.size(1) == heads ? t : t.repeat_interleave(heads / t.size(1), 1);
}

}  // namespace

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t heads,
                               int64_t kv_heads, int64_t head_size, const RotaryTables* rotary) {
  const int64_t rows = q.size(0), seq = q.size(1);
  const auto split = [&](const torch::Tensor& t, int64_t n) { return t.view({rows, seq, n, head_size}).transpose(1, 2); };
  torch::Tensor qh = split(q, heads), kh = split(k, kv_heads), vh = split(v, kv_heads);
  if (rotary) {
    qh = rotary->rotate(qh);
    kh = rotary->rotate(kh);
  }
  torch::Tensor out;
#if THETAD_TORCH_CUDA && (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5))
  // The fused kernel (flash / memory-efficient attention), grouped-query heads read in place:
  // repeating them would write and read back heads / kv_heads copies of every key and value.
  if (qh.is_cuda())
    out = at::scaled_dot_product_attention(qh, kh, vh, {}, 0.0, /*is_causal=*/true, std::nullopt,
                                           /*enable_gqa=*/kv_heads != heads);
#elif THETAD_TORCH_CUDA && TORCH_VERSION_MAJOR >= 2
  if (qh.is_cuda())
    out = at::scaled_dot_product_attention(qh, repeat_kv(kh, heads), repeat_kv(vh, heads), {}, 0.0, /*is_causal=*/true);
#endif
  if (!out.defined()) {
    kh = repeat_kv(kh, heads);
    vh = repeat_kv(vh, heads);
    // The plain formula; the softmax in float32.
    const torch::Tensor scores = torch::matmul(qh, kh.transpose(-2, -1)).to(torch::kFloat32) / std::sqrt(double(head_size));
    const torch::Tensor mask = torch::ones({seq, seq}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
    const torch::Tensor p = torch::softmax(scores.masked_fill(mask, -std::numeric_limits<float>::infinity()), -1);
    out = torch::matmul(p.to(vh.scalar_type()), vh);
  }
  return out.transpose(1, 2).reshape({rows, seq, heads * head_size});
}

}  // namespace thetad::daemon
