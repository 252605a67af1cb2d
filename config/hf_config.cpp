// apply_hf_config (see hf_config.hpp).
#include "config/hf_config.hpp"

#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <type_traits>
#include <utility>

#include "common/file_read.hpp"
#include "common/json_read.hpp"
#include "config/schema.hpp"

namespace thetad::config {

std::string hf_config_file(const std::string& init_from) {
  std::error_code ec;
  const std::filesystem::path from(init_from);
  return (std::filesystem::is_directory(from, ec) ? from / "config.json" : from.parent_path() / "config.json").string();
}

}  // namespace thetad::config

namespace thetad::config::detail {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string show(double v) { return format_double(v); }
std::string show(int64_t v) { return std::to_string(v); }
std::string show(bool v) { return v ? "true" : "false"; }
std::string show(RopeScaling v) { return to_string(v); }

// Hugging Face's model_type of each architecture thetad builds in its layout.
struct Family {
  const char* model_type;
  ModelArch arch;
};
constexpr Family kFamilies[] = {{"llama", ModelArch::Llama},
                                {"mistral", ModelArch::Mistral},
                                {"qwen2", ModelArch::Qwen2},
                                {"qwen3", ModelArch::Qwen3}};

class Apply {
 public:
  Apply(Diagnostics& diag, const json& cfg, std::string file) : diag_(diag), cfg_(cfg), file_(std::move(file)) {}

  // The job's `path` (value `member`) against config.json's `key` (absent: `fallback`).
  template <typename T>
  void key(const char* path, T& member, const char* key, T fallback, T job_value) {
    set(path, member, value(cfg_, key, key, fallback), key, job_value);
  }
  // `obj[key]` (shown as `shown` in messages) as a T; `fallback` where absent or null, and where
  // it is of another type (reported).
  template <typename T>
  T value(const json& obj, const char* key, const std::string& shown, T fallback) {
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    const bool good = std::is_same_v<T, bool> ? it->is_boolean()
                      : std::is_same_v<T, int64_t> ? it->is_number_integer()
                                                     : it->is_number();
    if (!good) {
      diag_.error("model.init_from", file_ + ": '" + shown + "' is " + json_brief(*it) + ", not " +
                                         (std::is_same_v<T, bool> ? "a boolean" : "a number"));
      return fallback;
    }
    // Every integer key here is a count or a size: 1 or more, and within int64 (a larger one
    // read as int64 wrapped negative and was blamed on the job's own key).
    if constexpr (std::is_same_v<T, int64_t>) {
      if (it->is_number_unsigned() ? it->template get<uint64_t>() > uint64_t(INT64_MAX) : it->template get<int64_t>() < 1) {
        diag_.error("model.init_from", file_ + ": '" + shown + "' is " + json_brief(*it) +
                                           ", not an integer in 1.." + std::to_string(INT64_MAX));
        return fallback;
      }
    }
    return it->get<T>();
  }
  // The job's `path` takes config.json's value `v` (of `shown`) where the job leaves it out, and
  // must equal it where the job gives it.
  template <typename T>
  void set(const char* path, T& member, T v, const std::string& shown, T job_value) {
    if (!diag_.given(path)) {
      member = v;
    } else if (job_value != v) {
      diag_.error(path, "is " + show(job_value) + " but " + file_ + " has " + shown + " = " + show(v) +
                            " (model.init_from's config); make them agree or leave " + path + " out");
    }
  }
  // A setting this transformer has no counterpart for must be absent, null or `want`.
  void require(const char* key, const json& want, const std::string& why) {
    const auto it = cfg_.find(key);
    if (it != cfg_.end() && !it->is_null() && *it != want)
      diag_.error("model.init_from", file_ + ": " + key + " = " + json_brief(*it) + " is not supported (" + why + ")");
  }
  void error(const char* path, const std::string& what) { diag_.error(path, file_ + ": " + what); }

 private:
  Diagnostics& diag_;
  const json& cfg_;
  std::string file_;
};

// The rotary positions: rope_theta and the frequencies' scaling, from rope_scaling and rope_theta
// (transformers 4) or rope_parameters, which holds both (transformers 5; rope_scaling wins where
// both are given, as transformers reads them; rope_theta is looked for in either, then alone).
void rotary(Apply& a, const json& cfg, ModelConfig& m) {
  const auto object = [&](const char* k) { return cfg.contains(k) && cfg[k].is_object() && !cfg[k].empty(); };
  const char* name = object("rope_scaling") ? "rope_scaling" : object("rope_parameters") ? "rope_parameters" : nullptr;
  static const json kNone = json::object();
  const json& rope = name ? cfg[name] : kNone;
  const std::string in = name ? std::string(name) + "." : std::string();
  std::string theta_key = "rope_theta";
  const json* theta_in = &cfg;
  for (const char* k : {"rope_parameters", "rope_scaling"})
    if (object(k) && cfg[k].contains("rope_theta")) theta_in = &cfg[k], theta_key = std::string(k) + ".rope_theta";
  const double theta = a.value<double>(*theta_in, "rope_theta", theta_key, 10000.0);
  a.set<double>("model.rope_theta", m.rope_theta, theta, theta_key, m.rope_theta);
  for (const json* where : {&cfg, &rope})
    if (where->contains("partial_rotary_factor") && !(*where)["partial_rotary_factor"].is_null() &&
        (*where)["partial_rotary_factor"] != 1.0)
      a.error("model.init_from", "partial_rotary_factor = " + json_brief((*where)["partial_rotary_factor"]) +
                                     " is not supported (thetad rotates every dimension of a head)");
  const json type = rope.contains("rope_type") ? rope["rope_type"] : rope.contains("type") ? rope["type"] : json("default");
  RopeScaling scaling = RopeScaling::None;
  if (type == "llama3") {
    scaling = RopeScaling::Llama3;
  } else if (type != "default") {
    a.error("model.init_from", std::string(name ? name : "rope_scaling") + " of type " + json_brief(type) +
                                   " is not supported (thetad computes the default rotary positions and llama3's)");
    return;
  }
  a.set<RopeScaling>("model.rope_scaling", m.rope_scaling, scaling, in + "rope_type", m.rope_scaling);
  if (scaling != RopeScaling::Llama3) return;
  for (const char* k : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
    if (!rope.contains(k) || rope[k].is_null())
      a.error("model.init_from", in + k + " is missing (rope_type llama3 needs factor, low_freq_factor, high_freq_factor "
                                          "and original_max_position_embeddings)");
  a.set<double>("model.rope_factor", m.rope_factor, a.value<double>(rope, "factor", in + "factor", m.rope_factor),
                in + "factor", m.rope_factor);
  a.set<double>("model.rope_low_freq_factor", m.rope_low_freq_factor,
                a.value<double>(rope, "low_freq_factor", in + "low_freq_factor", m.rope_low_freq_factor),
                in + "low_freq_factor", m.rope_low_freq_factor);
  a.set<double>("model.rope_high_freq_factor", m.rope_high_freq_factor,
                a.value<double>(rope, "high_freq_factor", in + "high_freq_factor", m.rope_high_freq_factor),
                in + "high_freq_factor", m.rope_high_freq_factor);
  a.set<int64_t>("model.rope_original_max_positions", m.rope_original_max_positions,
                 a.value<int64_t>(rope, "original_max_position_embeddings", in + "original_max_position_embeddings",
                                  m.rope_original_max_positions),
                 in + "original_max_position_embeddings", m.rope_original_max_positions);
}

// The width of a head: config.json's head_dim, else hidden_size / num_attention_heads (Qwen3's
// default is 128). model.head_dim keeps 0 where the two agree.
void head_dim(Apply& a, const json& cfg, ModelConfig& m, Diagnostics& diag) {
  if (m.heads <= 0) return;
  const int64_t even = m.d_model / m.heads;
  const int64_t v = a.value<int64_t>(cfg, "head_dim", "head_dim", m.arch == ModelArch::Qwen3 ? 128 : even);
  if (!diag.given("model.head_dim")) {
    m.head_dim = v == even && m.d_model % m.heads == 0 ? 0 : v;
  } else if (m.head_size() != v) {
    diag.error("model.head_dim", "is " + std::to_string(m.head_size()) + " but the heads of model.init_from's config are " +
                                     std::to_string(v) + " wide (head_dim, else hidden_size / num_attention_heads); make "
                                     "them agree or leave model.head_dim out");
  }
}

// A sliding window of attention (Mistral's sliding_window; Qwen's with use_sliding_window, on the
// layers from max_window_layers on; transformers 5: layer_types). thetad's attention sees every
// earlier position of a row, which is the window's result only while no row is longer than the
// window: a longer model.seq_len is refused rather than computed otherwise than the base was.
void sliding_window(Apply& a, const json& cfg, const ModelConfig& m, Diagnostics& diag, const std::string& where) {
  bool sliding = false;
  if (cfg.contains("layer_types") && cfg["layer_types"].is_array()) {
    for (const json& t : cfg["layer_types"]) sliding = sliding || t == "sliding_attention";
  } else if (m.arch == ModelArch::Mistral) {
    sliding = !cfg.contains("sliding_window") || !cfg["sliding_window"].is_null();  // MistralConfig's default: 4096
  } else if (m.arch == ModelArch::Qwen2 || m.arch == ModelArch::Qwen3) {
    sliding = a.value<bool>(cfg, "use_sliding_window", "use_sliding_window", false) &&
              a.value<int64_t>(cfg, "max_window_layers", "max_window_layers", 28) < m.layers;
  }
  if (!sliding) return;
  const int64_t window = a.value<int64_t>(cfg, "sliding_window", "sliding_window", 4096);
  if (window < m.seq_len)
    diag.error("model.seq_len", "is " + std::to_string(m.seq_len) + ", beyond " + where + "'s sliding_window = " +
                                    std::to_string(window) + ": thetad's attention sees every earlier position, which "
                                    "is what the window computes only for rows of at most sliding_window tokens; lower "
                                    "model.seq_len to " + std::to_string(window) + " or less");
}

// Every key of config.json that thetad reads, for a model of a supported family.
void interpret(const json& cfg, const std::string& where, ModelConfig& m, Diagnostics& diag) {
  const auto type = cfg.find("model_type");
  const Family* family = &kFamilies[0];  // a config.json without model_type: llama, as before
  if (type != cfg.end()) {
    family = nullptr;
    for (const Family& f : kFamilies)
      if (*type == f.model_type) family = &f;
    if (!family) {
      diag.error("model.init_from", where + ": model_type " + json_brief(*type) +
                                        " is not one thetad builds (llama, mistral, qwen2, qwen3)");
      return;
    }
  }
  if (diag.given("model.arch") && m.arch != family->arch) {
    diag.error("model.arch", "is " + to_string(m.arch) + " but " + where + " describes a " + family->model_type +
                                 " model (model_type)");
    return;
  }
  m.arch = family->arch;
  Apply a(diag, cfg, where);
  a.key<int64_t>("model.d_model", m.d_model, "hidden_size", m.d_model, m.d_model);
  a.key<int64_t>("model.layers", m.layers, "num_hidden_layers", m.layers, m.layers);
  a.key<int64_t>("model.heads", m.heads, "num_attention_heads", m.heads, m.heads);
  // HF's default for the key/value heads is the attention heads; the job's 0 means the same.
  a.key<int64_t>("model.kv_heads", m.kv_heads, "num_key_value_heads", m.heads, m.kv_heads > 0 ? m.kv_heads : m.heads);
  a.key<int64_t>("model.d_ff", m.d_ff, "intermediate_size", m.d_ff, m.d_ff);
  a.key<int64_t>("model.vocab", m.vocab, "vocab_size", m.vocab, m.vocab);
  a.key<double>("model.norm_eps", m.norm_eps, "rms_norm_eps", 1e-6, m.norm_eps);  // the four configs' default
  a.key<bool>("model.tie_embeddings", m.tie_embeddings, "tie_word_embeddings", false, m.tie_embeddings);
  rotary(a, cfg, m);
  head_dim(a, cfg, m, diag);
  a.require("hidden_act", "silu", "the MLP is SwiGLU with silu");
  // Qwen2's q, k and v have biases whatever attention_bias says; the others have none.
  if (m.arch != ModelArch::Qwen2) a.require("attention_bias", false, "the attention's projections have no bias");
  a.require("mlp_bias", false, "the MLP's projections have no bias");
  sliding_window(a, cfg, m, diag, where);
  const auto max_pos = cfg.find("max_position_embeddings");
  if (max_pos != cfg.end() && max_pos->is_number_integer() && max_pos->get<int64_t>() < m.seq_len)
    diag.error("model.seq_len", "is " + std::to_string(m.seq_len) + ", beyond " + where + "'s max_position_embeddings = " +
                                    json_brief(*max_pos));
}

}  // namespace

void apply_hf_config(Job& job, Diagnostics& diag) {
  ModelConfig& m = job.model;
  if (m.kind != ModelKind::Transformer || m.init_from.empty()) return;
  std::error_code ec;
  const fs::path from(m.init_from);
  if (!fs::exists(from, ec)) return;
  const bool dir = fs::is_directory(from, ec);
  const fs::path file = hf_config_file(m.init_from);
  const std::string where = file.string();
  const auto fail = [&](const std::string& what) { diag.error("model.init_from", where + ": " + what); };
  // Absent is told from unreadable (a directory without permission): stat's own reason.
  struct stat st {};
  if (::lstat(file.c_str(), &st) != 0) {
    if (errno != ENOENT) fail(std::string("cannot read: ") + std::strerror(errno));
    else if (dir) diag.error("model.init_from", "'" + m.init_from + "' has no config.json (a Hugging Face model directory has one)");
    return;
  }
  const std::string outside = link_outside(file.has_parent_path() ? file.parent_path().string() : ".", "config.json");
  if (!outside.empty()) return fail(outside);
  std::string text;
  const ReadResult read = read_regular_file(where, kMaxJsonFileBytes, text);
  if (!read) return fail((read.failure == ReadFailure::io ? "cannot read: " : "") + read.why);
  JsonProblem problem;
  const json cfg = parse_json(text.data(), text.data() + text.size(), problem);
  if (problem == JsonProblem::too_deep) return fail(json_problem_text(problem));
  if (problem != JsonProblem::none || !cfg.is_object()) return fail("not a JSON object");
  interpret(cfg, where, m, diag);
}

}  // namespace thetad::config::detail
