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

namespace thetad::config::detail {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string show(double v) { return format_double(v); }
std::string show(int64_t v) { return std::to_string(v); }
std::string show(bool v) { return v ? "true" : "false"; }

class Apply {
 public:
  Apply(Diagnostics& diag, const json& cfg, std::string file) : diag_(diag), cfg_(cfg), file_(std::move(file)) {}

  // The job's `path` (value `member`) against config.json's `key` (absent: `fallback`).
  template <typename T>
  void key(const char* path, T& member, const char* key, T fallback, T job_value) {
    T v = fallback;
    const auto it = cfg_.find(key);
    if (it != cfg_.end() && !it->is_null()) {
      const bool good = std::is_same_v<T, bool> ? it->is_boolean()
                        : std::is_same_v<T, int64_t> ? it->is_number_integer()
                                                       : it->is_number();
      if (!good) {
        diag_.error("model.init_from", file_ + ": '" + key + "' is " + json_brief(*it) + ", not a " +
                                           (std::is_same_v<T, bool> ? "boolean" : "number"));
        return;
      }
      // Every integer key here is a count or a size: 1 or more, and within int64 (a larger one
      // read as int64 wrapped negative and was blamed on the job's own key).
      if constexpr (std::is_same_v<T, int64_t>) {
        if (it->is_number_unsigned() ? it->template get<uint64_t>() > uint64_t(INT64_MAX) : it->template get<int64_t>() < 1) {
          diag_.error("model.init_from", file_ + ": '" + key + "' is " + json_brief(*it) +
                                             ", not an integer in 1.." + std::to_string(INT64_MAX));
          return;
        }
      }
      v = it->get<T>();
    }
    if (!diag_.given(path)) {
      member = v;
    } else if (job_value != v) {
      diag_.error(path, "is " + show(job_value) + " but " + file_ + " has " + key + " = " + show(v) +
                            " (model.init_from's config); make them agree or leave " + path + " out");
    }
  }
  // A setting this transformer has no counterpart for must be absent or `want`.
  void require(const char* key, const json& want, const std::string& why) {
    const auto it = cfg_.find(key);
    if (it != cfg_.end() && *it != want)
      diag_.error("model.init_from", file_ + ": " + key + " = " + json_brief(*it) + " is not supported (" + why + ")");
  }

 private:
  Diagnostics& diag_;
  const json& cfg_;
  std::string file_;
};

}  // namespace

void apply_hf_config(Job& job, Diagnostics& diag) {
  ModelConfig& m = job.model;
  if (m.kind != ModelKind::Transformer || m.init_from.empty()) return;
  std::error_code ec;
  const fs::path from(m.init_from);
  if (!fs::exists(from, ec)) return;
  const bool dir = fs::is_directory(from, ec);
  const fs::path file = dir ? from / "config.json" : from.parent_path() / "config.json";
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
  const auto type = cfg.find("model_type");
  if (type != cfg.end() && *type != "llama") {
    diag.error("model.init_from", where + ": model_type " + json_brief(*type) + " is not one thetad builds (llama)");
    return;
  }
  if (diag.given("model.arch") && m.arch != ModelArch::Llama) {
    diag.error("model.arch", "is " + to_string(m.arch) + " but " + where + " describes a llama model");
    return;
  }
  m.arch = ModelArch::Llama;
  Apply a(diag, cfg, where);
  a.key<int64_t>("model.d_model", m.d_model, "hidden_size", m.d_model, m.d_model);
  a.key<int64_t>("model.layers", m.layers, "num_hidden_layers", m.layers, m.layers);
  a.key<int64_t>("model.heads", m.heads, "num_attention_heads", m.heads, m.heads);
  // HF's default for the key/value heads is the attention heads; the job's 0 means the same.
  a.key<int64_t>("model.kv_heads", m.kv_heads, "num_key_value_heads", m.heads, m.kv_heads > 0 ? m.kv_heads : m.heads);
  a.key<int64_t>("model.d_ff", m.d_ff, "intermediate_size", m.d_ff, m.d_ff);
  a.key<int64_t>("model.vocab", m.vocab, "vocab_size", m.vocab, m.vocab);
  a.key<double>("model.rope_theta", m.rope_theta, "rope_theta", 10000.0, m.rope_theta);
  a.key<double>("model.norm_eps", m.norm_eps, "rms_norm_eps", 1e-6, m.norm_eps);  // LlamaConfig's defaults
  a.key<bool>("model.tie_embeddings", m.tie_embeddings, "tie_word_embeddings", false, m.tie_embeddings);
  a.require("hidden_act", "silu", "the llama MLP is SwiGLU with silu");
  a.require("attention_bias", false, "projections have no bias");
  a.require("mlp_bias", false, "projections have no bias");
  a.require("rope_scaling", nullptr, "plain rotary positions only");
  if (cfg.contains("head_dim") && !cfg["head_dim"].is_null() && m.heads > 0 &&
      (!cfg["head_dim"].is_number_integer() || cfg["head_dim"].get<int64_t>() != m.d_model / m.heads))
    diag.error("model.init_from", where + ": head_dim = " + json_brief(cfg["head_dim"]) +
                                      " is not hidden_size / num_attention_heads (" + std::to_string(m.d_model / m.heads) + ")");
  const auto max_pos = cfg.find("max_position_embeddings");
  if (max_pos != cfg.end() && max_pos->is_number_integer() && max_pos->get<int64_t>() < m.seq_len)
    diag.error("model.seq_len", "is " + std::to_string(m.seq_len) + ", beyond " + where + "'s max_position_embeddings = " +
                                    json_brief(*max_pos));
}

}  // namespace thetad::config::detail
