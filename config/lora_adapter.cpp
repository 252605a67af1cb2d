#include "config/lora_adapter.hpp"

#include <array>
#include <charconv>

namespace thetad::config {
namespace {

constexpr std::array<const char*, kLoraTargets> kWords = {"q", "k", "v", "o", "gate", "up", "down"};

// A non-negative decimal number that is all of `s` (no sign, no spaces).
std::optional<int64_t> whole_number(std::string_view s) {
  int64_t v = 0;
  if (s.empty() || s.front() == '-' || s.front() == '+') return std::nullopt;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace

const char* lora_target_word(LoraTarget t) { return kWords[static_cast<size_t>(t)]; }

std::optional<LoraTarget> lora_target_of(std::string_view word) {
  for (int i = 0; i < kLoraTargets; ++i)
    if (word == kWords[static_cast<size_t>(i)]) return static_cast<LoraTarget>(i);
  return std::nullopt;
}

std::string peft_module_of(LoraTarget t) {
  const std::string word = lora_target_word(t);
  const bool attention = t == LoraTarget::q || t == LoraTarget::k || t == LoraTarget::v || t == LoraTarget::o;
  return (attention ? "self_attn." : "mlp.") + word + "_proj";
}

LayerWidths layer_widths(const ModelConfig& m) {
  const bool llama = llama_family(m.arch);
  const int64_t head = llama ? m.head_size() : (m.heads > 0 ? m.d_model / m.heads : 0);
  const int64_t q = m.heads * head;
  return {m.d_model, q, llama && m.kv_heads > 0 ? m.kv_heads * head : q, m.d_ff};
}

LoraAdapter::LoraAdapter(const Job& job) : LoraAdapter(job.lora, job.model.layers, layer_widths(job.model)) {}

LoraAdapter::LoraAdapter(const LoraConfig& lora, int64_t layers, LayerWidths widths)
    : rank_(lora.rank), layers_(layers), scale_(lora.alpha / double(lora.rank)), widths_(widths) {
  for (const std::string& word : lora.targets)
    if (const auto t = lora_target_of(word)) targets_.push_back(*t);
}

bool LoraAdapter::adapts(LoraTarget t) const {
  for (LoraTarget u : targets_)
    if (u == t) return true;
  return false;
}

std::pair<int64_t, int64_t> LoraAdapter::base_shape(LoraTarget t) const {
  const LayerWidths& w = widths_;
  switch (t) {
    case LoraTarget::q: return {w.q, w.d_model};
    case LoraTarget::k:
    case LoraTarget::v: return {w.kv, w.d_model};
    case LoraTarget::o: return {w.d_model, w.q};
    case LoraTarget::gate:
    case LoraTarget::up: return {w.d_ff, w.d_model};
    case LoraTarget::down: return {w.d_model, w.d_ff};
  }
  return {0, 0};
}

std::vector<int64_t> LoraAdapter::shape(LoraTarget t, bool a) const {
  const auto [out, in] = base_shape(t);
  return a ? std::vector<int64_t>{rank_, in} : std::vector<int64_t>{out, rank_};
}

double LoraAdapter::elements_per_layer() const {
  double n = 0;
  for (LoraTarget t : targets_) {
    const auto [out, in] = base_shape(t);
    n += double(rank_) * (double(in) + double(out));
  }
  return n;
}

std::vector<LoraMatrix> LoraAdapter::matrices(int64_t task) const {
  std::vector<LoraMatrix> out;
  out.reserve(static_cast<size_t>(layers_) * targets_.size() * 2);
  for (int64_t layer = 0; layer < layers_; ++layer)
    for (LoraTarget t : targets_)
      for (bool a : {true, false}) out.push_back({task, layer, t, a});
  return out;
}

std::string LoraAdapter::name(const LoraMatrix& m) {
  return "lora." + std::to_string(m.task) + "." + std::to_string(m.layer) + "." + lora_target_word(m.target) +
         (m.a ? ".a" : ".b");
}

std::optional<LoraMatrix> LoraAdapter::parse(std::string_view name) {
  std::vector<std::string_view> parts;
  size_t from = 0;
  for (size_t dot = name.find('.'); ; dot = name.find('.', from)) {
    parts.push_back(name.substr(from, dot == std::string_view::npos ? std::string_view::npos : dot - from));
    if (dot == std::string_view::npos) break;
    from = dot + 1;
  }
  if (parts.size() != 5 || parts[0] != "lora" || (parts[4] != "a" && parts[4] != "b")) return std::nullopt;
  const auto task = whole_number(parts[1]), layer = whole_number(parts[2]);
  const auto target = lora_target_of(parts[3]);
  if (!task || !layer || !target) return std::nullopt;
  return LoraMatrix{*task, *layer, *target, parts[4] == "a"};
}

std::string LoraAdapter::peft_name(int64_t layer, LoraTarget t, bool a) {
  return "base_model.model.model.layers." + std::to_string(layer) + "." + peft_module_of(t) +
         (a ? ".lora_A.weight" : ".lora_B.weight");
}

}  // namespace thetad::config
