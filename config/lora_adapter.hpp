// The LoRA adapter a job's `lora` keys give each task of a transformer, as one type: its targets,
// the shapes of its matrices, its scale, its matrices' names in thetad ("lora.T.LAYER.TARGET.a|b",
// the parameter table's and the checkpoint's) and in PEFT's files, the one parser of those names
// and the one count of its size. The model builds its adapters from it, the PEFT import and export
// and the merged export name and read them through it, the memory estimates count them with it.
// Torch-free: plain numbers and strings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/job.hpp"

namespace thetad::config {

// The matrices of a decoder layer an adapter can target, in the order of lora.targets' words
// (gate: the llama family's only). The values index per-target arrays.
enum class LoraTarget : int { q, k, v, o, gate, up, down };
constexpr int kLoraTargets = 7;

// lora.targets' word for a target ("q"), and back (nullopt: not a target).
const char* lora_target_word(LoraTarget t);
std::optional<LoraTarget> lora_target_of(std::string_view word);
// The Hugging Face module a target adapts, PEFT's target_modules word: "q" -> "q_proj".
std::string peft_module_of(LoraTarget t);

// One matrix of one task's adapter: A ([rank, in]) or B ([out, rank]) of a layer's target.
struct LoraMatrix {
  int64_t task = 0, layer = 0;
  LoraTarget target = LoraTarget::q;
  bool a = true;
  bool operator==(const LoraMatrix& o) const {
    return task == o.task && layer == o.layer && target == o.target && a == o.a;
  }
};

// The widths a layer's matrices read and write: the model's, the attention's query width (heads
// x head size) and its key/value width (key/value heads x head size).
struct LayerWidths {
  int64_t d_model = 0, q = 0, kv = 0, d_ff = 0;
};
// The widths the transformer builds from the model keys (daemon/models/transformer.cpp).
LayerWidths layer_widths(const ModelConfig& m);

class LoraAdapter {
 public:
  // The job's adapter (its model and lora keys). Words of lora.targets that name no target are
  // left out: validation names them.
  explicit LoraAdapter(const Job& job);
  // An adapter over layers of `widths` (validation's upper bound of every architecture's).
  LoraAdapter(const LoraConfig& lora, int64_t layers, LayerWidths widths);

  const std::vector<LoraTarget>& targets() const { return targets_; }
  bool adapts(LoraTarget t) const;
  int64_t rank() const { return rank_; }
  int64_t layers() const { return layers_; }
  // The adapter's output is scaled by this: lora.alpha / lora.rank.
  double scale() const { return scale_; }

  // The base matrix a target adapts, [out, in] (adapted or not: the model builds every one).
  std::pair<int64_t, int64_t> base_shape(LoraTarget t) const;
  // A: [rank, in]; B: [out, rank].
  std::vector<int64_t> shape(LoraTarget t, bool a) const;
  // Elements of one layer's adapters (rank x (in + out) per target), and of a task's adapter.
  double elements_per_layer() const;
  double elements() const { return double(layers_) * elements_per_layer(); }

  // Every matrix of task `task`'s adapter in the order the model registers them: by layer, then
  // target in lora.targets' order, A before B.
  std::vector<LoraMatrix> matrices(int64_t task) const;

  // "lora.3.0.q.a": the matrix's name in the parameter table, checkpoints and metrics.
  static std::string name(const LoraMatrix& m);
  // The inverse; nullopt for a name that is no adapter matrix's.
  static std::optional<LoraMatrix> parse(std::string_view name);
  // PEFT's tensor name of a layer's matrix (the task is the file's):
  // "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight".
  static std::string peft_name(int64_t layer, LoraTarget t, bool a);

 private:
  std::vector<LoraTarget> targets_;
  int64_t rank_ = 0, layers_ = 0;
  double scale_ = 1.0;
  LayerWidths widths_;
};

}  // namespace thetad::config
