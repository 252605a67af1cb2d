// The transformer with per-task LoRA adapters, and its token data (see transformer.hpp).
#include "daemon/models/transformer.hpp"

#include <torch/version.h>

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "daemon/core/input_path.hpp"
#include "daemon/core/npy.hpp"
#include "daemon/models/param_builder.hpp"

namespace thetad::daemon {
namespace {

using namespace detail;

// The matrices a LoRA adapter can target, in the order of lora.targets' words.
enum Target { kQ, kK, kV, kO, kUp, kDown, kTargets };
constexpr std::array<const char*, kTargets> kTargetNames = {"q", "k", "v", "o", "up", "down"};

int target_of(const std::string& word) {
  for (int i = 0; i < kTargets; ++i)
    if (word == kTargetNames[static_cast<size_t>(i)]) return i;
  throw InternalError("lora.targets: '" + word + "' passed validation but is not a target");
}

struct Lora {
  torch::Tensor a, b;  // a: [rank x in], b: [out x rank]; undefined: not adapted
};

struct Block {
  torch::Tensor ln1_w, ln1_b, ln2_w, ln2_b;
  std::array<torch::Tensor, kTargets> w;  // q, k, v, o [d x d]; up [d_ff x d]; down [d x d_ff]
};

class Transformer : public TaskModel {
 public:
  Transformer(const config::Job& job, torch::Device device, bool lazy) : m_(job.model) {
    num_tasks_ = static_cast<int>(m_.tasks);
    const int64_t d = m_.d_model, ff = m_.d_ff;
    scale_ = job.lora.alpha / double(job.lora.rank);
    ParamBuilder pb(init_seed(job), device, params_, lazy);
    // Token and position embeddings: std 0.02 as GPT-2 (uniform of the same deviation).
    const double emb = 0.02 * std::sqrt(3.0);
    embed_ = pb.add("embed.weight", 0, {m_.vocab, d}, emb);
    pos_ = pb.add("pos.weight", 0, {m_.seq_len, d}, emb);
    const std::array<std::pair<int64_t, int64_t>, kTargets> shapes = {
        std::pair{d, d}, std::pair{d, d}, std::pair{d, d}, std::pair{d, d}, std::pair{ff, d}, std::pair{d, ff}};
    const std::array<const char*, kTargets> names = {"attn.q", "attn.k", "attn.v", "attn.o", "mlp.up", "mlp.down"};
    for (int64_t i = 0; i < m_.layers; ++i) {
      const std::string n = "blocks." + std::to_string(i) + ".";
      Block b;
      b.ln1_w = pb.add_filled(n + "ln1.weight", 0, {d}, 1.0);
      b.ln1_b = pb.add_filled(n + "ln1.bias", 0, {d}, 0.0);
      for (size_t k = 0; k < kTargets; ++k)
        b.w[k] = pb.add(n + names[k] + ".weight", 0, {shapes[k].first, shapes[k].second},
                        1.0 / std::sqrt(double(shapes[k].second)));
      b.ln2_w = pb.add_filled(n + "ln2.weight", 0, {d}, 1.0);
      b.ln2_b = pb.add_filled(n + "ln2.bias", 0, {d}, 0.0);
      blocks_.push_back(std::move(b));
    }
    lnf_w_ = pb.add_filled("ln_f.weight", 0, {d}, 1.0);
    lnf_b_ = pb.add_filled("ln_f.bias", 0, {d}, 0.0);
    head_ = pb.add("lm_head.weight", 0, {m_.vocab, d}, 1.0 / std::sqrt(double(d)));
    lora_.resize(static_cast<size_t>(m_.tasks));
    for (int64_t t = 0; t < m_.tasks; ++t) {
      const int g = static_cast<int>(t) + 1;
      lora_[static_cast<size_t>(t)].resize(static_cast<size_t>(m_.layers));
      for (int64_t i = 0; i < m_.layers; ++i) {
        for (const std::string& word : job.lora.targets) {
          const int k = target_of(word);
          const auto [out, in] = shapes[static_cast<size_t>(k)];
          const std::string n = "lora." + std::to_string(t) + "." + std::to_string(i) + "." + word;
          Lora& l = lora_[static_cast<size_t>(t)][static_cast<size_t>(i)][static_cast<size_t>(k)];
          l.a = pb.add(n + ".a", g, {job.lora.rank, in}, 1.0 / std::sqrt(double(in)));
          l.b = pb.add(n + ".b", g, {out, job.lora.rank}, 0.0);
        }
      }
    }
  }

  std::vector<NamedParam>& params() override { return params_; }
  LossKind loss_kind() const override { return LossKind::cross_entropy; }

  // x: int64 token ids [rows, seq]; logits [rows, seq, vocab].
  torch::Tensor forward(const torch::Tensor& x, int task) override {
    const int64_t rows = x.size(0), seq = x.size(1), d = m_.d_model;
    // The residual stream stays float32 (bf16 only inside the matmuls under autocast).
    torch::Tensor h = embed_.index_select(0, x.reshape({-1})).view({rows, seq, d}) + pos_.narrow(0, 0, seq);
    const auto& adapters = lora_.at(static_cast<size_t>(task));
    for (size_t i = 0; i < blocks_.size(); ++i) {
      const Block& b = blocks_[i];
      const auto& ad = adapters[i];
      const torch::Tensor a = norm(h, b.ln1_w, b.ln1_b);
      h = h + linear(attention(linear(a, b, ad, kQ), linear(a, b, ad, kK), linear(a, b, ad, kV)), b, ad, kO);
      const torch::Tensor f = norm(h, b.ln2_w, b.ln2_b);
      h = h + linear(torch::gelu(linear(f, b, ad, kUp)), b, ad, kDown);
    }
    return torch::matmul(norm(h, lnf_w_, lnf_b_), head_.t());
  }

  // Next-token cross-entropy over every position of every row (in float32).
  torch::Tensor loss(const Batch& batch, int task, uint64_t sample_seed) override {
    (void)sample_seed;
    return next_token_loss(forward(batch.x, task), batch.y);
  }

 private:
  // LayerNorm in float32 whatever the compute dtype (as autocast does on GPUs).
  torch::Tensor norm(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& b) const {
    return torch::layer_norm(h.to(torch::kFloat32), {m_.d_model}, w, b, 1e-5);
  }

  // x W^T, plus the task's LoRA path (alpha / rank) (x A^T) B^T where the target is adapted.
  torch::Tensor linear(const torch::Tensor& x, const Block& b, const std::array<Lora, kTargets>& ad, int k) const {
    torch::Tensor y = torch::linear(x, b.w[static_cast<size_t>(k)]);
    const Lora& l = ad[static_cast<size_t>(k)];
    if (l.a.defined()) y = y + torch::linear(torch::linear(x, l.a), l.b) * scale_;
    return y;
  }

  // Causal multi-head attention over [rows, seq, d] projections.
  torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) const {
    const int64_t rows = q.size(0), seq = q.size(1), heads = m_.heads, dh = m_.d_model / m_.heads;
    const auto split = [&](const torch::Tensor& t) { return t.view({rows, seq, heads, dh}).transpose(1, 2); };
    const torch::Tensor qh = split(q), kh = split(k), vh = split(v);
    torch::Tensor out;
#if THETAD_TORCH_CUDA && TORCH_VERSION_MAJOR >= 2
    // The fused kernel (flash / memory-efficient attention) where LibTorch has it.
    if (qh.is_cuda()) out = at::scaled_dot_product_attention(qh, kh, vh, {}, 0.0, /*is_causal=*/true);
#endif
    if (!out.defined()) {
      // The plain formula; the softmax in float32.
      const torch::Tensor scores = torch::matmul(qh, kh.transpose(-2, -1)).to(torch::kFloat32) / std::sqrt(double(dh));
      const torch::Tensor mask = torch::ones({seq, seq}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
      const torch::Tensor p = torch::softmax(scores.masked_fill(mask, -std::numeric_limits<float>::infinity()), -1);
      out = torch::matmul(p.to(vh.scalar_type()), vh);
    }
    return out.transpose(1, 2).reshape({rows, seq, m_.d_model});
  }

  config::ModelConfig m_;
  double scale_ = 1.0;
  std::vector<NamedParam> params_;
  torch::Tensor embed_, pos_, lnf_w_, lnf_b_, head_;
  std::vector<Block> blocks_;
  std::vector<std::vector<std::array<Lora, kTargets>>> lora_;  // [task][layer][target]
};

// Rows of seq_len + 1 tokens: inputs are the first seq_len, targets the last seq_len.
Batch split_windows(const torch::Tensor& windows) {
  const int64_t s = windows.size(1) - 1;
  return {windows.narrow(1, 0, s).contiguous(), windows.narrow(1, 1, s).contiguous()};
}

// Task t walks the vocabulary with stride 1 + (t x 7919 mod (vocab - 1)) from a random start;
// data.noise of the tokens are replaced by random ones (the walk goes on underneath). The next
// token follows from the current one and the task: the base can learn the walk, the adapters the
// task's stride.
class SyntheticTokens : public DataSource {
 public:
  SyntheticTokens(const config::Job& job, torch::Device device)
      : seed_(job.seed), vocab_(job.model.vocab), seq_(job.model.seq_len), noise_(job.data.noise), device_(device) {}
  Batch batch(int64_t step, int rank, int world, int task, int64_t rows) override {
    (void)world;
    auto gen = generator(mix_seed(seed_, 0x70c3, static_cast<uint64_t>(step), static_cast<uint64_t>(rank) * 1000003u + task));
    const int64_t stride = 1 + (int64_t{task} * 7919) % (vocab_ - 1);
    const torch::Tensor start = torch::randint(vocab_, {rows, 1}, gen, torch::kInt64);
    torch::Tensor w = (start + torch::arange(seq_ + 1, torch::kInt64).unsqueeze(0) * stride).remainder(vocab_);
    if (noise_ > 0) {
      const torch::Tensor flip = torch::rand({rows, seq_ + 1}, gen).lt(std::min(noise_, 1.0));
      w = torch::where(flip, torch::randint(vocab_, {rows, seq_ + 1}, gen, torch::kInt64), w);
    }
    return split_windows(w.to(device_));
  }

 private:
  uint64_t seed_;
  int64_t vocab_, seq_;
  double noise_;
  torch::Device device_;
};

// Token files data.dir/task{t}.npy: windows at random offsets, seeded like the synthetic data.
class TokenFiles : public DataSource {
 public:
  TokenFiles(const config::Job& job, torch::Device device)
      : seed_(job.seed), seq_(job.model.seq_len), device_(device) {
    for (int64_t t = 0; t < job.model.tasks; ++t) {
      const std::string path = input_path(job.data.dir, job) + "/task" + std::to_string(t) + ".npy";
      NpyArray a = NpyArray::open(path);
      a.require_ndim(1);
      torch::ScalarType type;
      if (a.dtype() == "<i8") type = torch::kInt64;
      else if (a.dtype() == "<i4") type = torch::kInt32;
      else if (a.dtype() == "<u2") type = torch::kInt16;  // read as bits, widened below
      else
        throw ConfigError(path + ": token ids must be int64, int32 or uint16, found " + npy_dtype_name(a.dtype()));
      if (a.numel() < seq_ + 1)
        throw ConfigError(path + ": " + std::to_string(a.numel()) + " tokens, fewer than one window of model.seq_len + 1 = " +
                          std::to_string(seq_ + 1));
      torch::Tensor ids = torch::from_blob(const_cast<void*>(a.data()), {a.numel()}, type);
      // Copied out of the map (which goes with `a`): widened, or cloned when already int64.
      ids = type == torch::kInt16 ? ids.to(torch::kInt32).bitwise_and(0xffff).to(torch::kInt64)
            : type == torch::kInt32 ? ids.to(torch::kInt64)
                                    : ids.clone();
      const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
      if (lo < 0 || hi >= job.model.vocab)
        throw ConfigError(path + ": token id " + std::to_string(lo < 0 ? lo : hi) + " is outside [0, model.vocab = " +
                          std::to_string(job.model.vocab) + ")");
      tokens_.push_back(ids);
    }
  }
  Batch batch(int64_t step, int rank, int world, int task, int64_t rows) override {
    (void)world;
    const torch::Tensor& ids = tokens_.at(static_cast<size_t>(task));
    auto gen = generator(mix_seed(seed_, 0x70c3, static_cast<uint64_t>(step), static_cast<uint64_t>(rank) * 1000003u + task));
    const torch::Tensor start = torch::randint(ids.size(0) - seq_, {rows, 1}, gen, torch::kInt64);
    const torch::Tensor index = start + torch::arange(seq_ + 1, torch::kInt64).unsqueeze(0);
    return split_windows(ids.index_select(0, index.reshape({-1})).view({rows, seq_ + 1}).to(device_));
  }

 private:
  uint64_t seed_;
  int64_t seq_;
  torch::Device device_;
  std::vector<torch::Tensor> tokens_;
};

}  // namespace

std::unique_ptr<TaskModel> make_transformer(const config::Job& job, torch::Device device, bool lazy_tasks) {
  return std::make_unique<Transformer>(job, device, lazy_tasks);
}

std::unique_ptr<DataSource> make_token_data(const config::Job& job, torch::Device device) {
  if (job.data.kind == config::DataKind::Tokens) return std::make_unique<TokenFiles>(job, device);
  return std::make_unique<SyntheticTokens>(job, device);
}

}  // namespace thetad::daemon
