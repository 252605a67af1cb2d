// A frozen base held in bf16 (precision: bf16, model.train_shared: false) against the
// same base held in float32 under autocast, on the CPU: the same losses and adapter gradients and
// values, bitwise, over several steps and tasks (Llama with untied and tied embeddings, from
// random values, from a float32 and from a bf16 safetensors file; the MLP's frozen trunk through
// trunk_layer), at half the bytes for every matrix autocast reads. A frozen base in nf4
// (model.base_quant) against the same base held whole with its matrices replaced by their nf4
// values: the same bits too.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "config/loader.hpp"
#include "daemon/formats/safetensors.hpp"
#include "daemon/models/model.hpp"
#include "daemon/ops/nf4.hpp"
#include "daemon/ops/precision.hpp"
#include "daemon/plan/placement.hpp"

namespace thetad::daemon {
namespace {

const std::string kLlama =
    "job: frozen\nseed: 7\nsteps: 4\nprecision: bf16\n"
    "model: {kind: transformer, arch: llama, layers: 2, d_model: 32, heads: 4, kv_heads: 2, d_ff: 48, vocab: 40, "
    "seq_len: 12, tasks: 3}\n"
    "lora: {rank: 2, alpha: 4, targets: [q, k, v, o, gate, up, down]}\n"
    "data: {kind: synthetic, batch_per_rank: 4, schedule: round_robin, noise: 0.05}\n";
const std::string kMlp =
    "job: frozen\nseed: 7\nsteps: 4\nprecision: bf16\n"
    "model: {kind: multitask_mlp, input_dim: 12, hidden: 24, trunk_layers: 3, head_layers: 2, tasks: 3}\n"
    "data: {kind: synthetic, batch_per_rank: 6, schedule: round_robin}\n";

config::Job job_of(const std::string& yaml, bool frozen, std::vector<std::string> sets = {}) {
  config::LoadOptions lo;
  lo.overrides = std::move(sets);
  lo.overrides.push_back(std::string("model.train_shared=") + (frozen ? "false" : "true"));
  return config::load_job_from_string(yaml, "frozen.yaml", lo);
}

int64_t base_bytes(TaskModel& m) {
  int64_t n = 0;
  for (const NamedParam& p : m.params())
    if (p.group == 0) n += p.tensor.numel() * static_cast<int64_t>(p.tensor.element_size());
  return n;
}

// Trains both models' task parameters side by side (SGD on the adapters, the base frozen in both
// as the worker freezes it) and expects every loss and task gradient to be the same bits.
void train_side_by_side(const config::Job& job, TaskModel& ma, TaskModel& mb) {
  auto data = make_data(job, ma, torch::kCPU);
  auto& pa = ma.params();
  auto& pb = mb.params();
  for (NamedParam& p : pa)
    if (p.group == 0) p.tensor.requires_grad_(false);
  for (NamedParam& p : pb)
    if (p.group == 0) p.tensor.requires_grad_(false);
  for (int64_t step = 0; step < job.steps; ++step) {
    for (int task = 0; task < ma.num_tasks(); ++task) {
      const Batch batch = data->batch(step, 0, 1, task, job.data.batch_per_rank);
      torch::Tensor la, lb;
      {
        const AutocastScope autocast(job.precision, torch::kCPU);
        la = ma.loss(batch, task, 11);
        lb = mb.loss(batch, task, 11);
      }
      la.backward();
      lb.backward();
      ASSERT_TRUE(la.equal(lb)) << "step " << step << " task " << task << ": " << la.item<float>() << " vs "
                                << lb.item<float>();
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < pa.size(); ++i) {
        if (pa[i].group != task + 1) continue;
        ASSERT_TRUE(pa[i].tensor.grad().defined()) << pa[i].name;
        ASSERT_TRUE(pa[i].tensor.grad().equal(pb[i].tensor.grad())) << pa[i].name << " at step " << step;
        pa[i].tensor.sub_(pa[i].tensor.grad() * 0.05);
        pb[i].tensor.sub_(pb[i].tensor.grad() * 0.05);
        pa[i].tensor.mutable_grad() = torch::Tensor();
        pb[i].tensor.mutable_grad() = torch::Tensor();
      }
    }
  }
  for (size_t i = 0; i < pa.size(); ++i)
    if (pa[i].group > 0) {
      EXPECT_TRUE(pa[i].tensor.equal(pb[i].tensor)) << pa[i].name;
    }
}

// The bf16-held base's values are the float32 one's rounded, and train alike (train_side_by_side).
void expect_same_training(const config::Job& held_bf16, const config::Job& held_fp32) {
  ASSERT_TRUE(Placement::of(held_bf16, 1).frozen_base_bf16);
  ASSERT_FALSE(Placement::of(held_fp32, 1).frozen_base_bf16);
  auto a = make_model(held_bf16, torch::kCPU), b = make_model(held_fp32, torch::kCPU);
  auto& pa = a->params();
  auto& pb = b->params();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    if (pa[i].group != 0) continue;
    pa[i].tensor.requires_grad_(false);
    pb[i].tensor.requires_grad_(false);
    // The values the bf16 base holds are what autocast's cast of the float32 one gives, and read
    // back (checkpoints, the hash) widened exactly.
    const torch::Tensor want = pa[i].tensor.scalar_type() == torch::kBFloat16
                                   ? pb[i].tensor.detach().to(torch::kBFloat16).to(torch::kFloat32)
                                   : pb[i].tensor.detach();
    EXPECT_TRUE(fp32_values(pa[i].tensor).equal(want)) << pa[i].name;
    EXPECT_EQ(fp32_values(pa[i].tensor).scalar_type(), torch::kFloat32);
  }
  train_side_by_side(held_bf16, *a, *b);
}

TEST(FrozenBaseBf16, LlamaSameBitsHalfTheMatrices) {
  for (const char* tie : {"false", "true"}) {
    const std::vector<std::string> sets{std::string("model.tie_embeddings=") + tie};
    const config::Job held = job_of(kLlama, true, sets), full = job_of(kLlama, false, sets);
    expect_same_training(held, full);
    // Every matrix autocast reads is bf16 (half its float32 bytes); random embeddings and the
    // norms stay float32.
    auto a = make_model(held, torch::kCPU), b = make_model(full, torch::kCPU);
    int64_t matrices = 0;
    for (size_t i = 0; i < a->params().size(); ++i) {
      const NamedParam& p = a->params()[i];
      if (p.group != 0) continue;
      const bool matrix = p.name.find(".attn.") != std::string::npos || p.name.find(".mlp.") != std::string::npos ||
                          p.name == "lm_head.weight";
      EXPECT_EQ(p.tensor.scalar_type(), matrix ? torch::kBFloat16 : torch::kFloat32) << p.name;
      if (matrix) matrices += p.tensor.numel() * 4;
    }
    EXPECT_GT(matrices, base_bytes(*b) / 2);
    EXPECT_EQ(base_bytes(*a), base_bytes(*b) - matrices / 2) << "tie_embeddings " << tie;
  }
}

// A base from safetensors: float32 tensors are rounded as autocast rounds them; bf16 tensors (a
// Hugging Face bf16 checkpoint) are taken as they are, the embedding included: the whole base
// but its norms in half the bytes.
TEST(FrozenBaseBf16, FromSafetensors) {
  const auto dir = std::filesystem::temp_directory_path() / ("thetad_frozen_bf16_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto source = make_model(job_of(kLlama, false), torch::kCPU);
  std::vector<torch::Tensor> keep;
  std::vector<StWriteTensor> f32, bf16;
  for (const NamedParam& p : source->params()) {
    if (p.group != 0) continue;
    const torch::Tensor v = p.tensor.detach().contiguous(), r = v.to(torch::kBFloat16);
    keep.push_back(v);
    keep.push_back(r);
    f32.push_back({p.name, "F32", v.sizes().vec(), v.data_ptr(), static_cast<size_t>(v.nbytes())});
    bf16.push_back({p.name, "BF16", r.sizes().vec(), r.data_ptr(), static_cast<size_t>(r.nbytes())});
  }
  write_safetensors((dir / "f32.safetensors").string(), f32);
  write_safetensors((dir / "bf16.safetensors").string(), bf16);
  for (const char* file : {"f32.safetensors", "bf16.safetensors"}) {
    const std::vector<std::string> sets{"model.init_from=" + (dir / file).string()};
    const config::Job held = job_of(kLlama, true, sets), full = job_of(kLlama, false, sets);
    expect_same_training(held, full);
    auto a = make_model(held, torch::kCPU), b = make_model(full, torch::kCPU);
    int64_t norms = 0;
    for (const NamedParam& p : a->params())
      if (p.group == 0 && p.tensor.scalar_type() == torch::kFloat32) norms += p.tensor.nbytes();
    const bool exact = std::string(file) == "bf16.safetensors";
    EXPECT_EQ(a->params().front().tensor.scalar_type(), exact ? torch::kBFloat16 : torch::kFloat32) << file;
    if (exact) {
      EXPECT_EQ(base_bytes(*a) - norms / 2, base_bytes(*b) / 2) << "all but the norms halve";
    }
  }
  std::filesystem::remove_all(dir);
}

// The MLP's frozen trunk runs through trunk_layer (its own autocast casts, weights and biases).
TEST(FrozenBaseBf16, MlpTrunkSameBits) {
  const config::Job held = job_of(kMlp, true), full = job_of(kMlp, false);
  expect_same_training(held, full);
  auto a = make_model(held, torch::kCPU), b = make_model(full, torch::kCPU);
  EXPECT_EQ(base_bytes(*a) * 2, base_bytes(*b));
}

// Anything else keeps float32: a trained base, fp32 or tf32 compute, Θ streamed from the host.
TEST(FrozenBaseBf16, OnlyWhereSafe) {
  EXPECT_FALSE(Placement::of(job_of(kLlama, false), 1).frozen_base_bf16);
  EXPECT_FALSE(Placement::of(job_of(kLlama, true, {"precision=fp32"}), 1).frozen_base_bf16);
  config::Job streamed = job_of(kMlp, true);
  streamed.offload.shared = config::SharedMode::Stream;
  EXPECT_FALSE(Placement::of(streamed, 1).frozen_base_bf16);
  auto m = make_model(job_of(kLlama, true, {"precision=tf32"}), torch::kCPU);
  for (const NamedParam& p : m->params()) EXPECT_EQ(p.tensor.scalar_type(), torch::kFloat32) << p.name;
}

// A drawn base in nf4: its matrices are placeholders (host_only, nothing held) whose init draws
// the builder's values; against the full base with each GEMM's matrices (q, k and v joined; gate
// and up) replaced by their nf4 values (and, in bf16, the embedding rounded to bf16), every loss
// and adapter gradient is the same bits, in fp32 and bf16, with the output layer untied
// (quantized too) and tied.
TEST(FrozenBaseNf4, DrawnBaseComputesAsItsDequantizedValues) {
  for (const char* precision : {"fp32", "bf16"}) {
    for (const char* tie : {"false", "true"}) {
      const std::vector<std::string> sets{std::string("model.tie_embeddings=") + tie, std::string("precision=") + precision};
      std::vector<std::string> with_quant = sets;
      with_quant.push_back("model.base_quant=nf4");
      const config::Job quant = job_of(kLlama, true, with_quant), full = job_of(kLlama, true, sets);
      auto a = make_model(quant, torch::kCPU), b = make_model(full, torch::kCPU);
      auto& pa = a->params();
      auto& pb = b->params();
      ASSERT_EQ(pa.size(), pb.size());
      std::map<std::string, torch::Tensor> held;
      int matrices = 0;
      for (size_t i = 0; i < pa.size(); ++i) {
        if (pa[i].group != 0) continue;
        ASSERT_EQ(pa[i].name, pb[i].name);
        held[pb[i].name] = pb[i].tensor.detach();
        if (!pa[i].host_only) {
          if (pa[i].tensor.scalar_type() != pb[i].tensor.scalar_type()) {
            // The embedding of a quantized base in bf16 (bf16 runs): the full base's values
            // rounded, which the reference then computes with too.
            EXPECT_EQ(pa[i].name, "embed.weight");
            EXPECT_EQ(pa[i].tensor.scalar_type(), torch::kBFloat16) << pa[i].name;
            EXPECT_TRUE(pa[i].tensor.equal(pb[i].tensor.to(torch::kBFloat16))) << pa[i].name;
            torch::NoGradGuard no_grad;
            pb[i].tensor.copy_(pa[i].tensor.to(pb[i].tensor.scalar_type()));
            continue;
          }
          EXPECT_TRUE(pa[i].tensor.equal(pb[i].tensor)) << pa[i].name;
          continue;
        }
        ++matrices;
        ASSERT_TRUE(pa[i].init) << pa[i].name;
        torch::Tensor drawn = torch::empty(pa[i].tensor.sizes(), torch::kFloat32);
        pa[i].init(drawn);
        EXPECT_TRUE(drawn.equal(fp32_values(pb[i].tensor))) << pa[i].name;
      }
      EXPECT_EQ(matrices, 2 * 7 + (std::string(tie) == "true" ? 0 : 1)) << "2 layers of 7 matrices, and lm_head";
      for (const NamedParam& p : pa) {  // the embedding of a quantized base stays bf16, as QLoRA's
        if (p.name == "embed.weight") {
          EXPECT_EQ(p.tensor.scalar_type(), std::string(precision) == "bf16" ? torch::kBFloat16 : torch::kFloat32);
        }
      }
      const auto quantize = [&](const std::vector<std::string>& names) {
        std::vector<torch::Tensor> ws;
        for (const std::string& n : names) ws.push_back(held.at(n));
        const torch::ScalarType dt = ws.front().scalar_type();
        const torch::Tensor values = nf4_dequantize(nf4_quantize(torch::cat(ws, 0)), dt == torch::kBFloat16 ? dt : torch::kFloat32);
        int64_t row = 0;
        for (torch::Tensor& w : ws) {
          w.copy_(values.narrow(0, row, w.size(0)));
          row += w.size(0);
        }
      };
      for (int layer = 0; layer < 2; ++layer) {
        const std::string n = "blocks." + std::to_string(layer) + ".";
        quantize({n + "attn.q.weight", n + "attn.k.weight", n + "attn.v.weight"});
        quantize({n + "attn.o.weight"});
        quantize({n + "mlp.gate.weight", n + "mlp.up.weight"});
        quantize({n + "mlp.down.weight"});
      }
      if (std::string(tie) == "false") quantize({"lm_head.weight"});
      train_side_by_side(quant, *a, *b);
    }
  }
}

}  // namespace
}  // namespace thetad::daemon
