// The transformer with per-task LoRA adapters (see transformer.hpp): model.arch gpt2, or the llama
// family (llama, mistral, qwen2, qwen3).
#include "daemon/models/transformer.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/errors.hpp"
#include "config/lora_adapter.hpp"

#include "daemon/ops/decoder_ops.hpp"
#include "daemon/ops/ffn_activation.hpp"
#include "daemon/ops/fused_llama_ops.hpp"
#include "daemon/ops/fused_cross_entropy.hpp"
#include "daemon/ops/joined_linear.hpp"
#include "daemon/models/param_builder.hpp"
#include "daemon/models/quantized_base.hpp"
#include "daemon/models/decoder_layer.hpp"
#include "daemon/ops/precision.hpp"
#include "daemon/ops/rotary.hpp"
#include "daemon/plan/placement.hpp"

namespace thetad::daemon {
namespace {

using namespace detail;
using namespace decoder;

class Transformer : public TaskModel {
 public:
  Transformer(const config::Job& job, const Placement& place, torch::Device device, bool lazy)
      : m_(job.model), adapter_(job), llama_(config::llama_family(job.model.arch)), train_shared_(job.model.train_shared),
        quantized_(job.model.base_quant == config::BaseQuant::Nf4),
        streamed_(place.streamed_base),
        join_base_(place.shared == HomeKind::resident && !quantized_ && !streamed_),
        masked_(job.data.loss_mask) {
    num_tasks_ = static_cast<int>(m_.tasks);
    const int64_t d = m_.d_model;
    dh_ = llama_ ? m_.head_size() : d / m_.heads;
    kv_heads_ = llama_ && m_.kv_heads > 0 ? m_.kv_heads : m_.heads;
    const bool qkv_bias = m_.arch == config::ModelArch::Qwen2;
    qk_norm_ = m_.arch == config::ModelArch::Qwen3;
    ParamBuilder pb(job, place, device, params_, lazy);
    const auto matrix = [&](const std::string& n, Block& b, int k) {
      const auto [out, in] = adapter_.base_shape(static_cast<config::LoraTarget>(k));
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
    for (config::LoraTarget t : adapter_.targets()) adapted_[static_cast<size_t>(t)] = true;
    lora_.resize(static_cast<size_t>(m_.tasks));
    for (int64_t t = 0; t < m_.tasks; ++t) {
      lora_[static_cast<size_t>(t)].resize(static_cast<size_t>(m_.layers));
      for (const config::LoraMatrix& mx : adapter_.matrices(t)) {
        const auto in = static_cast<double>(adapter_.base_shape(mx.target).second);
        Lora& l = lora_[static_cast<size_t>(t)][static_cast<size_t>(mx.layer)][static_cast<size_t>(mx.target)];
        // A drawn as a layer's weight of that input, B zero: the adapter starts as no change.
        (mx.a ? l.a : l.b) = pb.add(config::LoraAdapter::name(mx), static_cast<int>(t) + 1, adapter_.shape(mx.target, mx.a),
                                    mx.a ? 1.0 / std::sqrt(in) : 0.0);
      }
    }
    if (llama_) rotary_ = RotaryTables(m_, device);
    base_bf16_ = place.frozen_base_bf16;
  }

  std::vector<NamedParam>& params() override { return params_; }
  void set_activation_stash(ActivationStash* stash) override { stash_ = stash; }
  bool stashes_activations() const override { return true; }
  LossKind loss_kind() const override { return LossKind::cross_entropy; }

  // x: int64 token ids [rows, seq]; logits [rows, seq, vocab].
  torch::Tensor forward(const torch::Tensor& x, int task) override {
    const torch::Tensor h = hidden_states(x, {{task, x.size(0)}});
    return torch::matmul(h, head_weight(h).t());
  }

  void quantize_frozen_base(torch::Device compute) override;
  std::vector<BaseGemm> frozen_gemms() override { return layer_gemms(blocks_); }
  // The layers' GEMMs read from `source` from now on, their biases joined beside.
  void read_frozen_gemms(FrozenWeights& source, const std::vector<BaseGemm>& gemms) override {
    frozen_ = &source;
    for (const BaseGemm& g : gemms)
      if (g.layer >= 0) frozen_bias_[g.id] = g.biases.empty() ? torch::Tensor() : torch::cat(g.biases, 0);
  }

  // Next-token cross-entropy over every position of every row (in float32). A head that needs
  // no gradient (a frozen base) never makes all the logits at once: linear_cross_entropy.
  torch::Tensor loss(const Batch& batch, int task, uint64_t sample_seed) override {
    (void)sample_seed;
    return head_loss(hidden_states(batch.x, {{task, batch.x.size(0)}}), batch.y);
  }

  // The base once over every part's rows, each task's adapters on its own rows
  // (linear_with_adapters), the output layer's loss per part: each part's loss has the bits
  // loss() gives it alone where the base is frozen (every kernel but the adapters' is row-wise;
  // the adapters' batched GEMMs compute each task's product as its own GEMM does).
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
    return linear_cross_entropy(h.reshape({-1, h.size(-1)}), head_weight(h), next.reshape({-1}), 0, masked_);
  }

  // The output layer's matrix: its parameter, or (quantized) its values dequantized for this pass
  // in the dtype of the hidden states h, kept by the loss's node until its backward.
  torch::Tensor head_weight(const torch::Tensor& h) const {
    if (!quant_.has(kHeadGemm)) return head_;
    return quant_.values(kHeadGemm, h.scalar_type() == torch::kBFloat16 ? torch::kBFloat16 : torch::kFloat32);
  }

  // The final norm's output [rows, seq, d_model] in the GEMMs' dtype: what the output layer
  // multiplies. The segments' adapters are the model's, or `slots` where given.
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
    if (join_base_) join_frozen_base();
    if (quantized_) quant_.follow(x.device());
    for (auto& [id, bias] : frozen_bias_)
      if (bias.defined() && bias.device() != x.device()) bias = bias.to(x.device());
    torch::Tensor pending;  // a sublayer's output, added to h by the next norm
    const auto add_and_norm = [&](const torch::Tensor& w, const torch::Tensor& bias) {
      torch::Tensor out;
      if (llama_ && residual_rms_norm_fits(h, pending, w)) {  // one kernel each way: add, norm, cast
        std::tie(h, out) = residual_rms_norm(h, pending, w, m_.norm_eps);
      } else {
        if (pending.defined()) h = h + pending;
        out = compute_dtype(norm(h, w, bias));
      }
      pending = torch::Tensor();
      return out;
    };
    for (size_t i = 0; i < blocks_.size(); ++i) {
      const Block& b = blocks_[i];
      const Layer l{b, i, segments, slots};
      const Projected qkv = project(add_and_norm(b.ln1_w, b.ln1_b), l, kQkv);
      torch::Tensor attended;
      if (llama_ && !qk_norm_ && fused_kernels_for(qkv.joined)) {  // one pass: rotated, in SDPA's layout
        const auto [q, k, v] = rotary_split(qkv.joined, rotary_, m_.heads, kv_heads_, dh_);
        attended = causal_attention(q, k, v, m_.heads, kv_heads_, dh_, nullptr);
      } else {
        torch::Tensor q = qkv.out[kQ], k = qkv.out[kK];
        if (qk_norm_) {  // qwen3: each query and key head RMS-normed before the rotary positions
          q = head_norm(q, b.q_norm);
          k = head_norm(k, b.k_norm);
        }
        attended = attention(q, k, qkv.out[kV]);
      }
      pending = project(attended, l, kAttnOut).out[kO];
      // gpt2: down(gelu(up f)); llama (SwiGLU): down(silu(gate f) * up f). Their inputs, d_ff
      // wide, are what offload.activations sends to the host.
      const Projected gate_up = project(add_and_norm(b.ln2_w, b.ln2_b), l, kGateUp);
      const torch::Tensor inner = llama_ && fused_kernels_for(gate_up.joined)
                                      ? swiglu_joined(gate_up.joined, static_cast<int>(i), stash_)
                                      : ffn_activation(gate_up.out[kGate], gate_up.out[kUp], static_cast<int>(i), stash_);
      pending = project(inner, l, kFfnOut).out[kDown];
    }
    return add_and_norm(lnf_w_, lnf_b_);
  }

  torch::Tensor norm(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& b) const {
    return block_norm(h, w, b, /*rms=*/llama_, m_.norm_eps);
  }
  torch::Tensor head_norm(const torch::Tensor& x, const torch::Tensor& w) const { return head_rms_norm(x, w, dh_, m_.norm_eps); }

  // One block of a pass: its base weights, its index (the adapters' layer), the pass's tasks and
  // where their adapters are read (the model's, or slots).
  struct Layer {
    const Block& block;
    size_t index;
    const Segments& segments;
    const SlotTensors* slots;
  };

  // A norm's output in the dtype its GEMMs read under autocast, cast once for all of them
  // (autocast would cast it again for each GEMM that reads it: the base's and the adapters').
  static torch::Tensor compute_dtype(const torch::Tensor& x) {
    const auto dtype = active_autocast_dtype(x.device().type());
    return dtype && x.is_floating_point() ? x.to(*dtype) : x;
  }

  // The frozen base's projections of several targets joined (join_rows), again wherever a
  // target's parameters were re-pointed since (values loaded into the model). Parameters that
  // take a gradient (a trained base, or one a schedule trains now) are left as they are.
  void join_frozen_base() {
    for (Block& b : blocks_) {
      for (int p = 0; p < kProjections; ++p) {
        std::vector<torch::Tensor> ws, bs;
        for (int k : kMembers[static_cast<size_t>(p)]) {
          if (!b.w[static_cast<size_t>(k)].defined()) continue;
          ws.push_back(b.w[static_cast<size_t>(k)]);
          if (b.bias[static_cast<size_t>(k)].defined()) bs.push_back(b.bias[static_cast<size_t>(k)]);
        }
        if (ws.size() < 2 || trained(ws) || joined_in(b.joined_w[static_cast<size_t>(p)], ws)) continue;
        b.joined_w[static_cast<size_t>(p)] = join_rows(ws);
        b.joined_b[static_cast<size_t>(p)] = bs.size() == ws.size() ? join_rows(bs) : torch::Tensor();
        if (!bs.empty() && !b.joined_b[static_cast<size_t>(p)].defined()) b.joined_w[static_cast<size_t>(p)] = torch::Tensor();
      }
    }
  }

  // The outputs of projection p's targets on x, indexed by target (undefined: not in p, or no
  // such matrix: gpt2's gate): x W^T (+ bias: qwen2's q, k, v) plus each task's LoRA path
  // (alpha / rank) (x A^T) B^T on its rows where the target is adapted. One GEMM over the joined
  // matrix where the base is, the targets' outputs being views of its output.
  struct Projected {
    std::array<torch::Tensor, kTargets> out;
    torch::Tensor joined;  // the joined GEMM's output, whose columns `out` views; else undefined
  };
  Projected project(const torch::Tensor& x, const Layer& l, int p) const {
    const Block& b = l.block;
    std::vector<int> ks;
    std::vector<int64_t> outs;
    for (int k : kMembers[static_cast<size_t>(p)]) {
      if (!b.w[static_cast<size_t>(k)].defined()) continue;
      ks.push_back(k);
      outs.push_back(b.w[static_cast<size_t>(k)].size(0));
    }
    Projected out;
    const int gemm = gemm_id(l.index, p);
    const size_t j = static_cast<size_t>(p);
    const auto frozen = frozen_bias_.find(gemm);
    if (frozen != frozen_bias_.end() || (b.joined_w[j].defined() && !trained({b.w[static_cast<size_t>(ks.front())]}))) {
      const bool elsewhere = frozen != frozen_bias_.end();
      const FrozenWeight q{frozen_, gemm};
      out.joined = linear_with_adapters(x, b.joined_w[j], elsewhere ? frozen->second : b.joined_b[j], l, ks, outs,
                                        elsewhere ? &q : nullptr);
      const std::vector<torch::Tensor> parts = out.joined.split_with_sizes(outs, -1);
      for (size_t i = 0; i < ks.size(); ++i) out.out[static_cast<size_t>(ks[i])] = parts[i];
      return out;
    }
    for (size_t i = 0; i < ks.size(); ++i) {
      const size_t k = static_cast<size_t>(ks[i]);
      out.out[k] = linear_with_adapters(x, b.w[k], b.bias[k], l, {ks[i]}, {outs[i]});
    }
    return out;
  }

  static bool trained(const std::vector<torch::Tensor>& ws) {
    return std::any_of(ws.begin(), ws.end(), [](const torch::Tensor& w) { return w.requires_grad(); });
  }

  const Lora& adapter(int task, size_t layer, int k) const {
    return lora_[static_cast<size_t>(task)][layer][static_cast<size_t>(k)];
  }

  // x w^T (+ bias), the output of targets `ks` (of out sizes `outs`, w their matrix), plus each
  // segment's task's adapters on its rows: one node (lora_linear) with the base GEMM over all
  // rows. Segments of equal rows (the schedule's usual split) take two batched GEMMs over all
  // tasks at once; their adapters are stacked (or read from slots, stacked already), where a GEMM
  // pair per task would launch 2 x tasks small kernels per target.
  // `q`: w is read from a source there (nf4, streamed; w itself is not read).
  torch::Tensor linear_with_adapters(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                                     const Layer& l, const std::vector<int>& ks, const std::vector<int64_t>& outs,
                                     const FrozenWeight* q = nullptr) const {
    if (std::none_of(ks.begin(), ks.end(), [&](int k) { return adapted_[static_cast<size_t>(k)]; }))
      return q ? frozen_linear(x, *q, bias) : torch::linear(x, w, bias);
    const Segments& seg = l.segments;
    // The stacked adapters [n, ...] of the tasks `tasks` (slots: the pass's), joined over ks.
    const auto joined = [&](const std::vector<int>& tasks) {
      std::vector<torch::Tensor> as, bs;
      for (int k : ks) {
        if (!adapted_[static_cast<size_t>(k)]) {
          bs.emplace_back();
          continue;
        }
        if (l.slots) {
          const Lora& s = (*l.slots)[l.index][static_cast<size_t>(k)];
          as.push_back(s.a);
          bs.push_back(s.b);
          continue;
        }
        std::vector<torch::Tensor> ta, tb;
        for (int t : tasks) {
          ta.push_back(adapter(t, l.index, k).a);
          tb.push_back(adapter(t, l.index, k).b);
        }
        as.push_back(torch::stack(ta));
        bs.push_back(torch::stack(tb));
      }
      return std::pair{join_lora_a(as), join_lora_b(bs, outs)};
    };
    std::vector<int> tasks;
    std::vector<int64_t> rows;
    for (const Segment& s : seg) {
      tasks.push_back(s.task);
      rows.push_back(s.rows);
    }
    const auto [a, b] = joined(tasks);
    if (q) return lora_linear(x, *q, bias, a, b, adapter_.scale(), rows);
    return lora_linear(x, w, bias, a, b, adapter_.scale(), rows);
  }

  torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) const {
    return causal_attention(q, k, v, m_.heads, kv_heads_, dh_, llama_ ? &rotary_ : nullptr);
  }

  config::ModelConfig m_;
  config::LoraAdapter adapter_;  // lora's targets, shapes, scale and names
  bool llama_;
  bool qk_norm_ = false;  // qwen3
  bool train_shared_ = true;
  bool quantized_ = false;                // model.base_quant: nf4
  bool streamed_ = false;                 // the layers streamed or sharded (homes/streamed_base.hpp)
  bool join_base_ = false;                // a resident base: its projections joined while frozen
  bool masked_ = false;                   // data.loss_mask
  std::array<bool, kTargets> adapted_{};  // lora.targets
  int64_t dh_ = 0, kv_heads_ = 0;
  std::vector<NamedParam> params_;
  torch::Tensor embed_, pos_, lnf_w_, lnf_b_, head_;
  RotaryTables rotary_;  // the llama family's
  std::vector<Block> blocks_;
  std::vector<std::vector<std::array<Lora, kTargets>>> lora_;  // [task][layer][target]
  ActivationStash* stash_ = nullptr;                           // offload.activations
  // model.base_quant: the GEMMs' matrices in nf4, numbered layer by layer (gemm_id), the output
  // layer's last.
  QuantizedBase quant_;
  // The layers' GEMMs whose matrices come from a source (nf4, a streamed base), their joined biases.
  FrozenWeights* frozen_ = nullptr;
  std::map<int, torch::Tensor> frozen_bias_;
  static constexpr int kHeadGemm = -1;
  bool base_bf16_ = false;  // Placement::frozen_base_bf16: the matrices are held (and drawn) in bf16
};

// The layers' GEMMs and the output layer where it is not the embedding: quantized on the rank's
// device (QuantizedBase::quantize).
void Transformer::quantize_frozen_base(torch::Device compute) {
  // A streamed base's layers are quantized into host memory by its home; the output layer here.
  std::vector<BaseGemm> gemms = streamed_ ? std::vector<BaseGemm>{} : frozen_gemms();
  if (!m_.tie_embeddings) gemms.push_back({kHeadGemm, -1, {head_}, {}});
  quant_.quantize(gemms, params_, compute, base_bf16_ ? torch::kBFloat16 : torch::kFloat32);
  read_frozen_gemms(quant_.weights(), gemms);
}

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

  std::vector<std::string> slot_params(int task) const override {
    std::vector<std::string> out;
    for (size_t layer = 0; layer < slots_.size(); ++layer) {
      for (int k = 0; k < kTargets; ++k) {
        if (!slots_[layer][static_cast<size_t>(k)].a.defined()) continue;
        for (bool a : {true, false})
          out.push_back(config::LoraAdapter::name({task, static_cast<int64_t>(layer), static_cast<config::LoraTarget>(k), a}));
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

std::unique_ptr<TaskModel> make_transformer(const config::Job& job, const Placement& place, torch::Device device,
                                            bool lazy_tasks) {
  return std::make_unique<Transformer>(job, place, device, lazy_tasks);
}

}  // namespace thetad::daemon
