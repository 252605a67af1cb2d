// The Llama layer's own kernels (daemon/models/fused_llama_ops, llama_kernels.cu) against the
// operators' formulas in float32 on the same bf16 inputs, values and gradients. A GPU test: it
// skips without a CUDA device or where the build has no kernels (fused_kernels_for false).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "daemon/models/fused_llama_ops.hpp"
#include "daemon/models/rotary.hpp"

namespace thetad::daemon {
namespace {

// |a - b| <= 1e-2 |b|max: bf16 keeps 8 bits of mantissa, and the kernels round once.
void expect_close(const torch::Tensor& a, const torch::Tensor& b, const char* what) {
  const double err = (a.to(torch::kFloat32) - b.to(torch::kFloat32)).abs().max().item<double>();
  const double scale = b.to(torch::kFloat32).abs().max().item<double>();
  EXPECT_LE(err, 1e-2 * scale) << what << ": max error " << err << " of " << scale;
}

bool have_kernels() {
  return torch::cuda::is_available() &&
         fused_kernels_for(torch::zeros({1}, torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA)));
}

// ff 40: eight pairs a thread; 36 (not a multiple of eight): one.
TEST(FusedLlamaOps, SwigluJoinedIsSiluOfGateTimesUp) {
  if (!have_kernels()) GTEST_SKIP() << "no CUDA device or no model kernels in this build";
  for (int64_t ff : {40, 36}) {
    torch::manual_seed(1);
    const auto opts = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
    const torch::Tensor gu = (torch::randn({3, 5, 2 * ff}, opts) * 3).requires_grad_(true);
    const torch::Tensor out = swiglu_joined(gu, 0, nullptr);
    const torch::Tensor g = torch::randn_like(out);
    out.backward(g);

    const torch::Tensor ref_in = gu.detach().to(torch::kFloat32).requires_grad_(true);
    const torch::Tensor ref = torch::silu(ref_in.narrow(-1, 0, ff)) * ref_in.narrow(-1, ff, ff);
    ref.backward(g.to(torch::kFloat32));
    expect_close(out, ref, ff == 40 ? "forward, ff 40" : "forward, ff 36");
    expect_close(gu.grad(), ref_in.grad(), ff == 40 ? "gradient, ff 40" : "gradient, ff 36");
  }
}

void rotary_case(int64_t head);

// Heads of 16: eight pairs a thread; of 12: one.
TEST(FusedLlamaOps, RotarySplitIsTheRotationOfQAndKAndVAsItIs) {
  if (!have_kernels()) GTEST_SKIP() << "no CUDA device or no model kernels in this build";
  for (int64_t head : {16, 12}) rotary_case(head);
}

void rotary_case(int64_t head) {
  torch::manual_seed(2);
  config::ModelConfig m;
  m.d_model = 4 * head;
  m.heads = 4;
  m.kv_heads = 2;
  m.seq_len = 9;
  m.rope_theta = 10000.0;
  const RotaryTables tables(m, torch::kCUDA);
  const int64_t heads = 4, kv = 2, rows = 2, seq = 9;
  const auto opts = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  const torch::Tensor qkv = torch::randn({rows, seq, (heads + 2 * kv) * head}, opts).requires_grad_(true);
  const auto [q, k, v] = rotary_split(qkv, tables, heads, kv, head);
  const torch::Tensor gq = torch::randn_like(q), gk = torch::randn_like(k), gv = torch::randn_like(v);
  ((q.to(torch::kFloat32) * gq).sum() + (k.to(torch::kFloat32) * gk).sum() + (v.to(torch::kFloat32) * gv).sum()).backward();

  const torch::Tensor x = qkv.detach().to(torch::kFloat32).requires_grad_(true);
  const auto heads_of = [&](const torch::Tensor& t, int64_t n) { return t.view({rows, seq, n, head}).transpose(1, 2); };
  const auto flat = [&](const torch::Tensor& t) { return t.transpose(1, 2).reshape({rows, seq, -1}); };
  const torch::Tensor rq = flat(tables.rotate(heads_of(x.narrow(-1, 0, heads * head), heads)));
  const torch::Tensor rk = flat(tables.rotate(heads_of(x.narrow(-1, heads * head, kv * head), kv)));
  const torch::Tensor rv = x.narrow(-1, (heads + kv) * head, kv * head);
  ((rq * gq.to(torch::kFloat32)).sum() + (rk * gk.to(torch::kFloat32)).sum() + (rv * gv.to(torch::kFloat32)).sum()).backward();
  expect_close(q, rq, "q");
  expect_close(k, rk, "k");
  EXPECT_TRUE(torch::equal(v.to(torch::kFloat32), rv)) << "v is copied as it is";
  expect_close(qkv.grad(), x.grad(), "gradient");
}

}  // namespace
}  // namespace thetad::daemon
