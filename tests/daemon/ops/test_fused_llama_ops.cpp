// The models' own kernels (daemon/ops/fused_llama_ops, llama_kernels.cu,
// residual_norm_kernels.cu; the loss's cross_entropy_kernels.cu through linear_cross_entropy; the
// optimizer's adam_kernels.cu through adam_group; the nf4 base's nf4_kernels.cu through nf4_dequantize)
// against the operators' formulas in float32 on the same bf16 inputs, values and gradients. A GPU test: it
// skips without a CUDA device or where the build has no kernels (fused_kernels_for false).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "daemon/ops/fused_cross_entropy.hpp"
#include "daemon/ops/fused_llama_ops.hpp"
#include "daemon/ops/joined_linear.hpp"
#include "daemon/ops/nf4.hpp"
#include "daemon/optim/optimizer.hpp"
#include "daemon/ops/rotary.hpp"

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

// h + o and its RMSNorm in bf16 against the formula in float32; the gradients of h (float32) and o
// (bf16) from the norm's and the sum's. Width 40: four values a thread; 38: one. Without o: the
// norm of h alone.
TEST(FusedLlamaOps, ResidualRmsNormIsTheSumAndItsNorm) {
  if (!have_kernels()) GTEST_SKIP() << "no CUDA device or no model kernels in this build";
  for (int64_t d : {40, 38}) {
    for (bool add : {true, false}) {
      torch::manual_seed(3);
      const auto f32 = torch::TensorOptions().device(torch::kCUDA);
      const torch::Tensor h = torch::randn({3, 5, d}, f32).requires_grad_(true);
      const torch::Tensor o = add ? torch::randn({3, 5, d}, f32.dtype(torch::kBFloat16)).requires_grad_(true) : torch::Tensor();
      const torch::Tensor w = torch::rand({d}, f32) + 0.5;
      const auto [sum, n] = residual_rms_norm(h, o, w, 1e-5);
      const torch::Tensor g_n = torch::randn_like(n), g_sum = torch::randn_like(sum);
      ((n.to(torch::kFloat32) * g_n.to(torch::kFloat32)).sum() + (add ? (sum * g_sum).sum() : torch::zeros({}, f32))).backward();

      const torch::Tensor rh = h.detach().clone().requires_grad_(true);
      const torch::Tensor ro = add ? o.detach().to(torch::kFloat32).requires_grad_(true) : torch::Tensor();
      const torch::Tensor rs = add ? rh + ro : rh;
      const torch::Tensor rn = w * (rs * torch::rsqrt(rs.pow(2).mean(-1, true) + 1e-5));
      ((rn * g_n.to(torch::kFloat32)).sum() + (add ? (rs * g_sum).sum() : torch::zeros({}, f32))).backward();
      const std::string what = "width " + std::to_string(d) + (add ? ", h + o" : ", h");
      EXPECT_EQ(n.scalar_type(), torch::kBFloat16);
      if (add) {
        EXPECT_TRUE(torch::allclose(sum, rs, 1e-6, 1e-6)) << what << ": the sum";
      } else {
        EXPECT_TRUE(sum.is_same(h)) << what << ": h is the sum";
      }
      expect_close(n, rn, (what + ": norm").c_str());
      EXPECT_TRUE(torch::allclose(h.grad(), rh.grad(), 1e-4, 1e-4)) << what << ": h's gradient";
      if (add) expect_close(o.grad(), ro.grad(), (what + ": o's gradient").c_str());
    }
  }
}

// The output layer's loss on bf16 CUDA tensors (the softmax gradient kernel) against
// cross_entropy over the same bf16 logits widened to float32: the loss, and the hidden states'
// gradient. 40 classes: eight a thread; 37: one. Masked targets (-1) left out of the mean.
TEST(FusedLlamaOps, SoftmaxGradientKernelIsTheCrossEntropy) {
  if (!have_kernels()) GTEST_SKIP() << "no CUDA device or no model kernels in this build";
  for (int64_t classes : {40, 37}) {
    for (bool masked : {false, true}) {
      torch::manual_seed(5);
      const auto opts = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
      const torch::Tensor h = torch::randn({9, 16}, opts).requires_grad_(true);
      const torch::Tensor w = torch::randn({classes, 16}, opts);
      torch::Tensor y = torch::randint(classes, {9}, opts.dtype(torch::kInt64));
      if (masked) y.index_put_({torch::arange(0, 9, 3, y.options())}, -1);
      const torch::Tensor loss = linear_cross_entropy(h, w, y, 4, masked);
      loss.backward();

      const torch::Tensor rh = h.detach().clone().requires_grad_(true);
      const torch::Tensor logits = torch::matmul(rh, w.t()).to(torch::kFloat32);
      const torch::Tensor ref = torch::nn::functional::cross_entropy(
          logits, y, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
      ref.backward();
      const std::string what = std::to_string(classes) + " classes" + (masked ? ", masked" : "");
      EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-3 * std::abs(ref.item<double>())) << what;
      expect_close(h.grad(), rh.grad(), (what + ": gradient").c_str());
    }
  }
}

// adam_group on CUDA float32 tensors (the one-launch kernel) against torch.optim's formulas in
// float64 on the host: AdamW and Adam with weight decay, a clipping scale, step 3, and tensors
// from one element to several chunks.
TEST(FusedLlamaOps, AdamKernelIsTorchOptimsStep) {
  if (!have_kernels()) GTEST_SKIP() << "no CUDA device or no model kernels in this build";
  for (const auto kind : {config::OptimizerKind::AdamW, config::OptimizerKind::Adam}) {
    torch::manual_seed(8);
    AdamSettings s;
    s.kind = kind;
    s.lr = 1e-2;
    s.weight_decay = 0.1;
    s.step = 3;
    s.grad_scale = 0.5;
    std::vector<torch::Tensor> p, g, m, v;
    for (int64_t n : {1, 7, 4096, 4097, 20000}) {
      const auto opts = torch::TensorOptions().device(torch::kCUDA);
      p.push_back(torch::randn({n}, opts));
      g.push_back(torch::randn({n}, opts));
      m.push_back(torch::randn({n}, opts) * 0.1);
      v.push_back(torch::rand({n}, opts) * 0.1);
    }
    const auto host64 = [](const std::vector<torch::Tensor>& ts) {
      std::vector<torch::Tensor> out;
      for (const auto& t : ts) out.push_back(t.to(torch::kCPU, torch::kFloat64));
      return out;
    };
    std::vector<torch::Tensor> rp = host64(p), rg = host64(g), rm = host64(m), rv = host64(v);
    adam_group(p, g, m, v, s);
    const double bias1 = 1 - std::pow(s.beta1, 3.0), bias2 = 1 - std::pow(s.beta2, 3.0);
    for (size_t i = 0; i < rp.size(); ++i) {
      torch::Tensor grad = rg[i] * s.grad_scale;
      if (kind == config::OptimizerKind::AdamW) rp[i] = rp[i] * (1 - s.lr * s.weight_decay);
      else grad = grad + s.weight_decay * rp[i];
      rm[i] = s.beta1 * rm[i] + (1 - s.beta1) * grad;
      rv[i] = s.beta2 * rv[i] + (1 - s.beta2) * grad * grad;
      rp[i] = rp[i] - s.lr / bias1 * rm[i] / (rv[i].sqrt() / std::sqrt(bias2) + s.eps);
      EXPECT_TRUE(torch::allclose(p[i].to(torch::kCPU, torch::kFloat64), rp[i], 1e-5, 1e-6)) << "param " << i;
      EXPECT_TRUE(torch::allclose(m[i].to(torch::kCPU, torch::kFloat64), rm[i], 1e-5, 1e-6)) << "exp_avg " << i;
      EXPECT_TRUE(torch::allclose(v[i].to(torch::kCPU, torch::kFloat64), rv[i], 1e-5, 1e-6)) << "exp_avg_sq " << i;
    }
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

// The GPU computes the CPU's function: the same codes and absmax from the quantizer, bitwise the
// same dequantized values from the kernel (the vectorized path: a count of a multiple of 8; the
// byte path: an odd count, and float32), and the GEMMs over the quantized base bitwise those over
// its dequantized values (the same GEMMs on the same values).
TEST(FusedLlamaOps, Nf4KernelIsTheCpusDequantization) {
  if (!have_kernels()) GTEST_SKIP() << "no CUDA device or no model kernels in this build";
  torch::manual_seed(7);
  for (const auto& shape : {std::vector<int64_t>{96, 256}, std::vector<int64_t>{13, 37}}) {
    const torch::Tensor w = torch::randn(shape).to(torch::kBFloat16);
    const Nf4Matrix cpu = nf4_quantize(w), gpu = nf4_quantize(w.to(torch::kCUDA));
    EXPECT_TRUE(torch::equal(gpu.codes.cpu(), cpu.codes));
    EXPECT_TRUE(torch::equal(gpu.absmax.cpu(), cpu.absmax));
    for (const torch::ScalarType dt : {torch::kBFloat16, torch::kFloat32})
      EXPECT_TRUE(torch::equal(nf4_dequantize(gpu, dt).cpu(), nf4_dequantize(cpu, dt)));
  }
  const auto opts = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  const Nf4Matrix q = nf4_quantize(torch::randn({192, 128}, opts));
  Nf4Weights weights;
  weights.add(0, q);
  const torch::Tensor x = torch::randn({4, 8, 128}, opts).requires_grad_(true);
  const torch::Tensor a = torch::randn({2, 16, 128}, opts).requires_grad_(true);
  const torch::Tensor b = torch::randn({2, 192, 16}, opts).requires_grad_(true);
  const torch::Tensor y = lora_linear(x, FrozenWeight{&weights, 0}, torch::Tensor(), a, b, 2.0, {2, 2});
  const torch::Tensor g = torch::randn_like(y);
  const auto grads = torch::autograd::grad({y}, {x, a, b}, {g});
  const torch::Tensor xr = x.detach().requires_grad_(true), ar = a.detach().requires_grad_(true),
                      br = b.detach().requires_grad_(true);
  const torch::Tensor yr = lora_linear(xr, nf4_dequantize(q, torch::kBFloat16), torch::Tensor(), ar, br, 2.0, {2, 2});
  const auto want = torch::autograd::grad({yr}, {xr, ar, br}, {g});
  EXPECT_TRUE(torch::equal(y, yr));
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(grads[i], want[i])) << "gradient " << i;
}

}  // namespace
}  // namespace thetad::daemon
