// The transformer with per-task LoRA adapters (see transformer.hpp): model.arch gpt2, or the llama
// family (llama, mistral, qwen2, qwen3).
#include "daemon/models/transformer.hpp"

#include <torch/version.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/errors.hpp"

#include "daemon/models/ffn_activation.hpp"
#include "daemon/models/fused_cross_entropy.hpp"
#include "daemon/models/param_builder.hpp"
#include "daemon/models/precision.hpp"
#include "daemon/models/rotary.hpp"

namespace thetad::daemon {
namespace {

using namespace detail;

// The matrices a LoRA adapter can target, in the order of lora.targets' words (gate: llama only).
enum Target { kQ, kK, kV, kO, kGate, kUp, kDown, kTargets };
constexpr std::array<const char*, kTargets> kTargetNames = {"q", "k", "v", "o", "gate", "up", "down"};
constexpr std::array<const char*, kTargets> kParamNames = {"attn.q", "attn.k", "attn.v", "attn.o",
                                                           "mlp.gate", "mlp.up", "mlp.down"};

int target_of(const std::string& word) {
  for (int i = 0; i < kTargets; ++i)
    if (word == kTargetNames[static_cast<size_t>(i)]) return i;
  throw InternalError("lora.targets: '" + word + "' passed validation but is not a target");
}

struct Lora {
  torch::Tensor a, b;  // a: [rank x in], b: [out x rank]; undefined: not adapted
};

struct Block {
  torch::Tensor ln1_w, ln1_b, ln2_w, ln2_b;  // the biases: gpt2 only
  std::array<torch::Tensor, kTargets> w;     // [out x in]; gate undefined for gpt2
  std::array<torch::Tensor, kTargets> bias;  // qwen2's q, k and v; undefined elsewhere
  torch::Tensor q_norm, k_norm;              // qwen3: RMSNorm weights [head size] of each query and key head
};

class Transformer : public TaskModel {
 public:
  Transformer(const config::Job& job, torch::Device device, bool lazy)
      : m_(job.model), llama_(config::llama_family(job.model.arch)), train_shared_(job.model.train_shared),
        masked_(job.data.loss_mask) {
    num_tasks_ = static_cast<int>(m_.tasks);
    const int64_t d = m_.d_model, ff = m_.d_ff;
    dh_ = llama_ ? m_.head_size() : d / m_.heads;
    kv_heads_ = llama_ && m_.kv_heads > 0 ? m_.kv_heads : m_.heads;
    const int64_t q = m_.heads * dh_, kv = kv_heads_ * dh_;
    scale_ = job.lora.alpha / double(job.lora.rank);
    const std::array<std::pair<int64_t, int64_t>, kTargets> shapes = {
        std::pair{q, d}, std::pair{kv, d}, std::pair{kv, d}, std::pair{d, q},
        std::pair{ff, d}, std::pair{ff, d}, std::pair{d, ff}};
    const bool qkv_bias = m_.arch == config::ModelArch::Qwen2;
    qk_norm_ = m_.arch == config::ModelArch::Qwen3;
    ParamBuilder pb(job, device, params_, lazy);
    const auto matrix = [&](const std::string& n, Block& b, int k) {
      const auto [out, in] = shapes[static_cast<size_t>(k)];
      b.w[static_cast<size_t>(k)] = pb.add(n + kParamNames[static_cast<size_t>(k)] + ".weight", 0, {out, in},
                                           1.0 / std::sqrt(double(in)), Read::autocast);
      // Zero at the start, as Hugging Face initialises a bias (a base's come from its file).
      if (qkv_bias && k <= kV)
        b.bias[static_cast<size_t>(k)] = pb.add_filled(n + kParamNames[static_cast<size_t>(k)] + ".bias", 0, {out}, 0.0);
    };
    // Token (gpt2: and position) embeddings: std 0.02 as GPT-2 (uniform of the same deviation).
    const double emb = 0.02 * std::sqrt(3.0);
    // Read by index (widened to float32 there) and, tied, as the output layer's matmul: held in
    // bf16 only where that is exact (hold_embedding_in_bf16).
    embed_ = pb.add("embed.weight", 0, {m_.vocab, d}, emb);
    if (!llama_) pos_ = pb.add("pos.weight", 0, {m_.seq_len, d}, emb);
    for (int64_t i = 0; i < m_.layers; ++i) {
      const std::string n = "blocks." + std::to_string(i) + ".";
      Block b;
      // Registration order: gpt2's as it always was (parameter seeds follow it); llama's as
      // Hugging Face lists a layer (attention, then MLP).
      b.ln1_w = pb.add_filled(n + "ln1.weight", 0, {d}, 1.0);
      if (!llama_) b.ln1_b = pb.add_filled(n + "ln1.bias", 0, {d}, 0.0);
      for (int k : {kQ, kK, kV, kO}) matrix(n, b, k);
      if (qk_norm_) b.q_norm = pb.add_filled(n + "attn.q_norm.weight", 0, {dh_}, 1.0);
      if (qk_norm_) b.k_norm = pb.add_filled(n + "attn.k_norm.weight", 0, {dh_}, 1.0);
      if (llama_) b.ln2_w = pb.add_filled(n + "ln2.weight", 0, {d}, 1.0);
      if (llama_) matrix(n, b, kGate);
      for (int k : {kUp, kDown}) matrix(n, b, k);
      if (!llama_) b.ln2_w = pb.add_filled(n + "ln2.weight", 0, {d}, 1.0);
      if (!llama_) b.ln2_b = pb.add_filled(n + "ln2.bias", 0, {d}, 0.0);
      blocks_.push_back(std::move(b));
    }
    lnf_w_ = pb.add_filled("ln_f.weight", 0, {d}, 1.0);
    if (!llama_) lnf_b_ = pb.add_filled("ln_f.bias", 0, {d}, 0.0);
    head_ = m_.tie_embeddings ? embed_ : pb.add("lm_head.weight", 0, {m_.vocab, d}, 1.0 / std::sqrt(double(d)), Read::autocast);
    for (const std::string& word : job.lora.targets) adapted_[static_cast<size_t>(target_of(word))] = true;
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
    if (llama_) rotary_ = RotaryTables(m_, device);
  }

  std::vector<NamedParam>& params() override { return params_; }
  void set_activation_stash(ActivationStash* stash) override { stash_ = stash; }
  bool stashes_activations() const override { return true; }
  LossKind loss_kind() const override { return LossKind::cross_entropy; }

  // x: int64 token ids [rows, seq]; logits [rows, seq, vocab].
  torch::Tensor forward(const torch::Tensor& x, int task) override {
    return torch::matmul(hidden_states(x, {{task, x.size(0)}}), head_.t());
  }

  // Next-token cross-entropy over every position of every row (in float32). A head that needs
  // no gradient (a frozen base) never makes all the logits at once: linear_cross_entropy.
  torch::Tensor loss(const Batch& batch, int task, uint64_t sample_seed) override {
    (void)sample_seed;
    return head_loss(hidden_states(batch.x, {{task, batch.x.size(0)}}), batch.y);
  }

  // The base once over every part's rows, each task's adapters on its own rows (lora_delta), the
  // output layer's loss per part: each part's loss has the bits loss() gives it alone where the
  // base is frozen (every kernel but the adapters' is row-wise; the adapters' batched GEMMs
  // compute each task's product as its own GEMM does).
  std::vector<torch::Tensor> losses(const std::vector<TaskRows>& parts) override {
    if (parts.size() == 1) return {loss(*parts[0].batch, parts[0].task, parts[0].sample_seed)};
    Segments segments;
    std::vector<torch::Tensor> xs;
    std::vector<int64_t> rows;
    for (const TaskRows& p : parts) {
      segments.push_back({p.task, p.batch->x.size(0)});
      xs.push_back(p.batch->x);
      rows.push_back(p.batch->x.size(0));
    }
    // split, not narrow: its backward is one cat of the parts' gradients, where each narrow's
    // would be a zero tensor of every row.
    const std::vector<torch::Tensor> hs = hidden_states(torch::cat(xs), segments).split_with_sizes(rows);
    std::vector<torch::Tensor> out;
    for (size_t i = 0; i < parts.size(); ++i) out.push_back(head_loss(hs[i], parts[i].batch->y));
    return out;
  }
  bool fuses_tasks() const override { return true; }
  // Below ~1,024 tokens a task's GEMMs leave an H100 idle between kernels: a fused pass of 8
  // tasks x 2 rows of 384 tokens took 29 ms where 8 passes took 49 (CUDA graphs, H200). Above,
  // a pass per task keeps one task's activations alive at little cost: 2 tasks x 3 rows, 15.0 ms
  // and 1.67 GiB split, 12.4 ms and 2.28 GiB fused.
  bool fusing_pays(int64_t rows) const override { return rows * m_.seq_len < 1024; }

  // A frozen base only: the slots are the pass's only leaves (a trained Θ would need its own
  // gradients too).
  std::unique_ptr<SlotPass> slot_pass(int parts, int64_t rows) override;

 private:
  class Slots;
  // Per layer and target, the adapters of a pass's tasks stacked: a [tasks, rank, in],
  // b [tasks, out, rank] (undefined where the target is not adapted).
  using SlotTensors = std::vector<std::array<Lora, kTargets>>;

  // The tasks of a pass, in the order of its rows: each task's adapters apply to its own rows.
  struct Segment {
    int task;
    int64_t rows;
  };
  using Segments = std::vector<Segment>;

  // data.loss_mask: targets of -1 (prompt tokens) are left out, the mean is over the others.
  torch::Tensor head_loss(const torch::Tensor& h, const torch::Tensor& next) const {
    return linear_cross_entropy(h.reshape({-1, h.size(-1)}), head_, next.reshape({-1}), 0, masked_);
  }

  // The final norm's output [rows, seq, d_model]: what the output layer multiplies. The
  // segments' adapters are the model's, or `slots` where given.
  torch::Tensor hidden_states(const torch::Tensor& x, const Segments& segments, const SlotTensors* slots = nullptr) {
    const int64_t rows = x.size(0), seq = x.size(1), d = m_.d_model;
    // The rotary tables are no parameters: a model built on the host for a host store (offload)
    // has its Θ moved to the device by the store, not these. They follow the tokens once.
    if (llama_ && rotary_.cos.device() != x.device()) {
      rotary_.cos = rotary_.cos.to(x.device());
      rotary_.sin = rotary_.sin.to(x.device());
    }
    // The residual stream stays float32 (bf16 only inside the matmuls under autocast).
    // (A frozen base may hold the embedding in bf16, where that is exact: widened here.)
    torch::Tensor h = embed_.index_select(0, x.reshape({-1})).to(torch::kFloat32).view({rows, seq, d});
    if (!llama_) h = h + pos_.narrow(0, 0, seq);
    for (size_t i = 0; i < blocks_.size(); ++i) {
      const Block& b = blocks_[i];
      const Layer l{b, i, segments, slots};
      const torch::Tensor a = norm(h, b.ln1_w, b.ln1_b);
      torch::Tensor q = linear(a, l, kQ), k = linear(a, l, kK);
      if (qk_norm_) {  // qwen3: each query and key head RMS-normed before the rotary positions
        q = head_norm(q, b.q_norm);
        k = head_norm(k, b.k_norm);
      }
      h = h + linear(attention(q, k, linear(a, l, kV)), l, kO);
      const torch::Tensor f = norm(h, b.ln2_w, b.ln2_b);
      // gpt2: down(gelu(up f)); llama (SwiGLU): down(silu(gate f) * up f). Their inputs, d_ff
      // wide, are what offload.activations sends to the host.
      const torch::Tensor gate = llama_ ? linear(f, l, kGate) : torch::Tensor();
      const torch::Tensor inner = ffn_activation(gate, linear(f, l, kUp), static_cast<int>(i), stash_);
      h = h + linear(inner, l, kDown);
    }
    return norm(h, lnf_w_, lnf_b_);
  }

  // In float32 whatever the compute dtype (as autocast does on GPUs, and as Hugging Face's
  // LlamaRMSNorm does): LayerNorm (gpt2) or RMSNorm x / sqrt(mean(x^2) + eps) * w (llama).
  torch::Tensor norm(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& b) const {
    const torch::Tensor h32 = h.to(torch::kFloat32);
    if (!llama_) return torch::layer_norm(h32, {m_.d_model}, w, b, m_.norm_eps);
#if THETAD_TORCH_CUDA && (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8))
    // One fused kernel each way on GPUs, where the formula is five passes over the activations.
    if (h32.is_cuda()) return at::rms_norm(h32, {m_.d_model}, w, m_.norm_eps);
#endif
    return w * (h32 * torch::rsqrt(h32.pow(2).mean(-1, /*keepdim=*/true) + m_.norm_eps));
  }

  // Hugging Face's RMSNorm of each head of x [rows, seq, heads x head size] with weight w [head
  // size], in float32.
  torch::Tensor head_norm(const torch::Tensor& x, const torch::Tensor& w) const {
    const torch::Tensor h32 = x.view({x.size(0), x.size(1), -1, dh_}).to(torch::kFloat32);
    return (w * (h32 * torch::rsqrt(h32.pow(2).mean(-1, /*keepdim=*/true) + m_.norm_eps))).view(x.sizes());
  }

  // One block of a pass: its base weights, its index (the adapters' layer), the pass's tasks and
  // where their adapters are read (the model's, or slots).
  struct Layer {
    const Block& block;
    size_t index;
    const Segments& segments;
    const SlotTensors* slots;
  };

  // x W^T (+ bias: qwen2's q, k, v), plus each task's LoRA path (alpha / rank) (x A^T) B^T on its
  // rows where the target is adapted.
  torch::Tensor linear(const torch::Tensor& x, const Layer& l, int k) const {
    const torch::Tensor y = torch::linear(x, l.block.w[static_cast<size_t>(k)], l.block.bias[static_cast<size_t>(k)]);
    if (!adapted_[static_cast<size_t>(k)]) return y;
    return y + lora_delta(x, l, k) * scale_;
  }

  const Lora& adapter(int task, size_t layer, int k) const {
    return lora_[static_cast<size_t>(task)][layer][static_cast<size_t>(k)];
  }

  // (x A^T) B^T of each segment's task on its rows. Segments of equal rows (the schedule's
  // usual split) take two batched GEMMs over all tasks at once, where a GEMM pair per task would
  // launch 2 x tasks small kernels per target and layer.
  torch::Tensor lora_delta(const torch::Tensor& x, const Layer& l, int k) const {
    const Segments& seg = l.segments;
    if (l.slots) {
      const Lora& s = (*l.slots)[l.index][static_cast<size_t>(k)];
      if (seg.size() == 1) return torch::linear(torch::linear(x, s.a.select(0, 0)), s.b.select(0, 0));
      return batched_delta(x, s.a, s.b);
    }
    if (seg.size() == 1) {
      const Lora& a = adapter(seg.front().task, l.index, k);
      return torch::linear(torch::linear(x, a.a), a.b);
    }
    const bool equal = std::all_of(seg.begin(), seg.end(), [&](const Segment& s) { return s.rows == seg.front().rows; });
    if (equal) {
      std::vector<torch::Tensor> as, bs;
      for (const Segment& s : seg) {
        as.push_back(adapter(s.task, l.index, k).a);
        bs.push_back(adapter(s.task, l.index, k).b);
      }
      return batched_delta(x, torch::stack(as), torch::stack(bs));
    }
    std::vector<int64_t> rows;
    for (const Segment& s : seg) rows.push_back(s.rows);
    const std::vector<torch::Tensor> xs = x.split_with_sizes(rows);
    std::vector<torch::Tensor> ds;
    for (size_t i = 0; i < seg.size(); ++i) {
      const Lora& a = adapter(seg[i].task, l.index, k);
      ds.push_back(torch::linear(torch::linear(xs[i], a.a), a.b));
    }
    return torch::cat(ds);
  }

  // x [n x rows, ..., in] through n stacked adapters a [n, rank, in], b [n, out, rank], each on
  // its own rows.
  static torch::Tensor batched_delta(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b) {
    const torch::Tensor z = torch::bmm(x.reshape({a.size(0), -1, x.size(-1)}), a.transpose(1, 2));
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = b.size(1);
    return torch::bmm(z, b.transpose(1, 2)).view(shape);
  }

  // Causal attention over [rows, seq, heads x dh] queries and [rows, seq, kv_heads x dh] keys and
  // values (llama: rotary positions, each key/value head shared by heads / kv_heads queries).
  // Rows are independent sequences: a fused pass takes its tasks' rows at once.
  torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) const {
    const int64_t rows = q.size(0), seq = q.size(1);
    const auto split = [&](const torch::Tensor& t, int64_t heads) { return t.view({rows, seq, heads, dh_}).transpose(1, 2); };
    torch::Tensor qh = split(q, m_.heads), kh = split(k, kv_heads_), vh = split(v, kv_heads_);
    if (llama_) {
      qh = rotary_.rotate(qh);
      kh = rotary_.rotate(kh);
    }
    torch::Tensor out;
#if THETAD_TORCH_CUDA && (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5))
    // The fused kernel (flash / memory-efficient attention), grouped-query heads read in place:
    // repeating them would write and read back heads / kv_heads copies of every key and value.
    if (qh.is_cuda())
      out = at::scaled_dot_product_attention(qh, kh, vh, {}, 0.0, /*is_causal=*/true, std::nullopt,
                                             /*enable_gqa=*/kv_heads_ != m_.heads);
#elif THETAD_TORCH_CUDA && TORCH_VERSION_MAJOR >= 2
    if (qh.is_cuda()) out = at::scaled_dot_product_attention(qh, repeat_kv(kh), repeat_kv(vh), {}, 0.0, /*is_causal=*/true);
#endif
    if (!out.defined()) {
      kh = repeat_kv(kh);
      vh = repeat_kv(vh);
      // The plain formula; the softmax in float32.
      const torch::Tensor scores = torch::matmul(qh, kh.transpose(-2, -1)).to(torch::kFloat32) / std::sqrt(double(dh_));
      const torch::Tensor mask = torch::ones({seq, seq}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
      const torch::Tensor p = torch::softmax(scores.masked_fill(mask, -std::numeric_limits<float>::infinity()), -1);
      out = torch::matmul(p.to(vh.scalar_type()), vh);
    }
    return out.transpose(1, 2).reshape({rows, seq, m_.heads * dh_});
  }

  // Each key/value head repeated for the heads / kv_heads query heads that share it.
  torch::Tensor repeat_kv(const torch::Tensor& t) const {
    return kv_heads_ == m_.heads ? t : t.repeat_interleave(m_.heads / kv_heads_, 1);
  }

  config::ModelConfig m_;
  bool llama_;
  bool qk_norm_ = false;  // qwen3
  bool train_shared_ = true;
  bool masked_ = false;                   // data.loss_mask
  std::array<bool, kTargets> adapted_{};  // lora.targets
  int64_t dh_ = 0, kv_heads_ = 0;
  double scale_ = 1.0;
  std::vector<NamedParam> params_;
  torch::Tensor embed_, pos_, lnf_w_, lnf_b_, head_;
  RotaryTables rotary_;  // the llama family's
  std::vector<Block> blocks_;
  std::vector<std::vector<std::array<Lora, kTargets>>> lora_;  // [task][layer][target]
  ActivationStash* stash_ = nullptr;                           // offload.activations
};

// The transformer's SlotPass: per layer and adapted target, a slot of `parts` adapters (a and b),
// allocated at the first bind where the tasks' adapters live.
class Transformer::Slots final : public SlotPass {
 public:
  Slots(Transformer& model, int parts, int64_t rows) : m_(model), parts_(parts), rows_(rows) {}

  const std::vector<torch::Tensor>& slots() const override { return leaves_; }

  void bind(const std::vector<int>& tasks) override {
    THETAD_CHECK(static_cast<int>(tasks.size()) == parts_, InternalError, "a slot pass of ", parts_,
                 " parts bound to ", tasks.size(), " tasks");
    torch::NoGradGuard no_grad;
    if (leaves_.empty()) allocate(tasks.front());
    for (size_t i = 0; i < slots_.size(); ++i) {
      for (int k = 0; k < kTargets; ++k) {
        Lora& s = slots_[i][static_cast<size_t>(k)];
        if (!s.a.defined()) continue;
        std::vector<torch::Tensor> as, bs;
        for (int t : tasks) {
          as.push_back(m_.adapter(t, i, k).a);
          bs.push_back(m_.adapter(t, i, k).b);
        }
        torch::stack_out(s.a, as);
        torch::stack_out(s.b, bs);
      }
    }
  }

  std::vector<torch::Tensor> losses(const torch::Tensor& x, const std::vector<torch::Tensor>& ys) override {
    const Segments segments(static_cast<size_t>(parts_), Segment{-1, rows_});
    const std::vector<int64_t> rows(static_cast<size_t>(parts_), rows_);
    const std::vector<torch::Tensor> hs = m_.hidden_states(x, segments, &slots_).split_with_sizes(rows);
    std::vector<torch::Tensor> out;
    for (size_t i = 0; i < hs.size(); ++i) out.push_back(m_.head_loss(hs[i], ys[i]));
    return out;
  }

  std::vector<std::pair<std::string, torch::Tensor>> grads(int task, int i,
                                                           const std::vector<torch::Tensor>& slot_grads) const override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    size_t leaf = 0;
    for (size_t layer = 0; layer < slots_.size(); ++layer) {
      for (int k = 0; k < kTargets; ++k) {
        if (!slots_[layer][static_cast<size_t>(k)].a.defined()) continue;
        const std::string n = "lora." + std::to_string(task) + "." + std::to_string(layer) + "." +
                              kTargetNames[static_cast<size_t>(k)];
        out.emplace_back(n + ".a", slot_grads.at(leaf++).select(0, i));
        out.emplace_back(n + ".b", slot_grads.at(leaf++).select(0, i));
      }
    }
    return out;
  }

 private:
  void allocate(int task) {
    slots_.resize(m_.blocks_.size());
    for (size_t i = 0; i < slots_.size(); ++i) {
      for (int k = 0; k < kTargets; ++k) {
        if (!m_.adapted_[static_cast<size_t>(k)]) continue;
        const Lora& a = m_.adapter(task, i, k);
        Lora& s = slots_[i][static_cast<size_t>(k)];
        const auto slot = [&](const torch::Tensor& like) {
          std::vector<int64_t> shape{parts_};
          for (int64_t d : like.sizes()) shape.push_back(d);
          return torch::zeros(shape, like.options()).requires_grad_(true);
        };
        s.a = slot(a.a);
        s.b = slot(a.b);
        leaves_.push_back(s.a);
        leaves_.push_back(s.b);
      }
    }
  }

  Transformer& m_;
  const int parts_;
  const int64_t rows_;
  SlotTensors slots_;
  std::vector<torch::Tensor> leaves_;  // slots_' tensors in layer, target, a-then-b order
};

std::unique_ptr<SlotPass> Transformer::slot_pass(int parts, int64_t rows) {
  if (train_shared_) return nullptr;
  return std::make_unique<Slots>(*this, parts, rows);
}

}  // namespace

std::unique_ptr<TaskModel> make_transformer(const config::Job& job, torch::Device device, bool lazy_tasks) {
  return std::make_unique<Transformer>(job, device, lazy_tasks);
}

void hold_embedding_in_bf16(const config::Job& job, TaskModel& model) {
  if (!frozen_base_in_bf16(job) || job.model.kind != config::ModelKind::Transformer) return;
  torch::NoGradGuard no_grad;
  for (NamedParam& p : model.params()) {
    if (p.group != 0 || p.name != "embed.weight" || p.tensor.scalar_type() != torch::kFloat32) continue;
    torch::Tensor held = p.tensor.detach().to(torch::kBFloat16);
    if (held.to(torch::kFloat32).equal(p.tensor.detach())) p.tensor.set_data(held);  // the model's handle too
  }
}

}  // namespace thetad::daemon
