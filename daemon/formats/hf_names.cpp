// Hugging Face <-> thetad parameter names (see hf_names.hpp).
#include "daemon/formats/hf_names.hpp"

#include <array>
#include <cctype>
#include <utility>

namespace thetad::daemon {
namespace {

// Per layer: (HF suffix after "model.layers.N.", thetad suffix after "blocks.N.").
// Qwen2's biases of q, k and v and Qwen3's norms of each query and key head are parameters of
// those families only.
constexpr std::array<std::pair<const char*, const char*>, 14> kLayer = {{
    {"input_layernorm.weight", "ln1.weight"},
    {"self_attn.q_proj.weight", "attn.q.weight"},
    {"self_attn.q_proj.bias", "attn.q.bias"},
    {"self_attn.k_proj.weight", "attn.k.weight"},
    {"self_attn.k_proj.bias", "attn.k.bias"},
    {"self_attn.v_proj.weight", "attn.v.weight"},
    {"self_attn.v_proj.bias", "attn.v.bias"},
    {"self_attn.o_proj.weight", "attn.o.weight"},
    {"self_attn.q_norm.weight", "attn.q_norm.weight"},
    {"self_attn.k_norm.weight", "attn.k_norm.weight"},
    {"post_attention_layernorm.weight", "ln2.weight"},
    {"mlp.gate_proj.weight", "mlp.gate.weight"},
    {"mlp.up_proj.weight", "mlp.up.weight"},
    {"mlp.down_proj.weight", "mlp.down.weight"},
}};
constexpr std::array<std::pair<const char*, const char*>, 3> kWhole = {{
    {"model.embed_tokens.weight", "embed.weight"},
    {"model.norm.weight", "ln_f.weight"},
    {"lm_head.weight", "lm_head.weight"},
}};

// "PREFIX<digits>.REST" -> (digits, REST); false when `s` is not of that form.
bool split_layer(const std::string& s, const std::string& prefix, std::string& layer, std::string& rest) {
  if (s.compare(0, prefix.size(), prefix) != 0) return false;
  size_t i = prefix.size();
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == prefix.size() || i - prefix.size() > 9 || i >= s.size() || s[i] != '.') return false;
  if (s[prefix.size()] == '0' && i - prefix.size() > 1) return false;  // "01" is not a layer
  layer = s.substr(prefix.size(), i - prefix.size());
  rest = s.substr(i + 1);
  return true;
}

std::string translate(const std::string& name, const std::string& from_prefix, const std::string& to_prefix, bool to_thetad) {
  for (const auto& [hf, ours] : kWhole)
    if (name == (to_thetad ? hf : ours)) return to_thetad ? ours : hf;
  std::string layer, rest;
  if (!split_layer(name, from_prefix, layer, rest)) return "";
  for (const auto& [hf, ours] : kLayer)
    if (rest == (to_thetad ? hf : ours)) return to_prefix + layer + "." + (to_thetad ? ours : hf);
  return "";
}

}  // namespace

std::string thetad_name_of_hf(const std::string& hf) { return translate(hf, "model.layers.", "blocks.", true); }
std::string hf_name_of_thetad(const std::string& name) { return translate(name, "blocks.", "model.layers.", false); }

}  // namespace thetad::daemon
