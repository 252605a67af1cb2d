// The job schema as data: one row per YAML key. Adding a key to job.hpp means adding one row
// here, one line in docs/configuration.md and, if it has a range, one check in validate.cpp.
#include "config/schema.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>
#include <utility>

#include "common/errors.hpp"

namespace thetad::config {

namespace {

// The YAML words of each enum, in enumerator order.
template <typename E>
const std::vector<std::string>& words();

#define THETAD_ENUM_WORDS(E, ...)                                              \
  template <>                                                                  \
  const std::vector<std::string>& words<E>() {                                 \
    static const std::vector<std::string> w = {__VA_ARGS__};                   \
    return w;                                                                  \
  }

THETAD_ENUM_WORDS(Precision, "fp32", "tf32", "bf16")
THETAD_ENUM_WORDS(GradDtype, "fp32", "bf16")
THETAD_ENUM_WORDS(Backend, "auto", "mpi", "nccl")
THETAD_ENUM_WORDS(Average, "contributors", "world")
THETAD_ENUM_WORDS(Active, "declared", "discover")
THETAD_ENUM_WORDS(ScheduleKind, "round_robin", "weighted", "per_rank", "all", "alternate")
THETAD_ENUM_WORDS(DataKind, "synthetic", "npy", "tokens")
THETAD_ENUM_WORDS(ModelKind, "multitask_mlp", "multitask_adapter", "extreme_classifier", "torchscript",
                  "transformer")
THETAD_ENUM_WORDS(OptimizerKind, "adamw", "adam", "sgd")
THETAD_ENUM_WORDS(LrSchedule, "constant", "cosine")
THETAD_ENUM_WORDS(NonFinite, "stop", "skip_step", "warn")
THETAD_ENUM_WORDS(Backward, "auto", "joint", "per_task")
THETAD_ENUM_WORDS(SharedMode, "resident", "stream")
THETAD_ENUM_WORDS(H2dDtype, "fp32", "bf16")
THETAD_ENUM_WORDS(HostGroups, "all", "scheduled")
THETAD_ENUM_WORDS(UncachedUpdate, "auto", "host", "device")
THETAD_ENUM_WORDS(ModelArch, "gpt2", "llama", "mistral", "qwen2", "qwen3")
THETAD_ENUM_WORDS(RopeScaling, "none", "llama3")
THETAD_ENUM_WORDS(BaseQuant, "none", "nf4")
THETAD_ENUM_WORDS(BaseShard, "none", "node")
THETAD_ENUM_WORDS(ExportDtype, "fp32", "bf16", "fp16")
THETAD_ENUM_WORDS(TokenDtype, "npy", "uint16", "uint32")
THETAD_ENUM_WORDS(SoleUser, "keep", "broadcast")
THETAD_ENUM_WORDS(ExportPick, "last", "eval_loss")

#undef THETAD_ENUM_WORDS

template <typename E>
const std::string& word_of(E v) {
  const auto& w = words<E>();
  const auto i = static_cast<size_t>(v);
  THETAD_CHECK(i < w.size(), InternalError, "config: enum value ", i, " has no YAML word");
  return w[i];
}

template <typename E>
bool parse_word(const std::string& word, E& out) {
  const auto& w = words<E>();
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] == word) {
      out = static_cast<E>(i);
      return true;
    }
  }
  return false;
}

}  // namespace

#define THETAD_ENUM_API(E)                                                              \
  const std::string& to_string(E v) { return word_of(v); }                              \
  bool from_string(const std::string& word, E& out) { return parse_word(word, out); }

THETAD_ENUM_API(Precision)
THETAD_ENUM_API(GradDtype)
THETAD_ENUM_API(H2dDtype)
THETAD_ENUM_API(HostGroups)
THETAD_ENUM_API(UncachedUpdate)
THETAD_ENUM_API(Backend)
THETAD_ENUM_API(Average)
THETAD_ENUM_API(Active)
THETAD_ENUM_API(ScheduleKind)
THETAD_ENUM_API(DataKind)
THETAD_ENUM_API(ModelKind)
THETAD_ENUM_API(OptimizerKind)
THETAD_ENUM_API(LrSchedule)
THETAD_ENUM_API(NonFinite)
THETAD_ENUM_API(Backward)
THETAD_ENUM_API(SharedMode)
THETAD_ENUM_API(ModelArch)
THETAD_ENUM_API(RopeScaling)
THETAD_ENUM_API(BaseQuant)
THETAD_ENUM_API(BaseShard)
THETAD_ENUM_API(ExportDtype)
THETAD_ENUM_API(TokenDtype)
THETAD_ENUM_API(SoleUser)
THETAD_ENUM_API(ExportPick)

#undef THETAD_ENUM_API

bool AlternateEntry::parse(const std::string& word, AlternateEntry& out) {
  if (word == "shared" || word == "tasks") {
    out = {word == "shared" ? Kind::Shared : Kind::Tasks, -1};
    return true;
  }
  const std::string digits = word.size() > 5 && word.compare(0, 5, "task:") == 0 ? word.substr(5) : "";
  bool good = !digits.empty() && digits.size() <= 9;
  for (char ch : digits) good = good && std::isdigit(static_cast<unsigned char>(ch));
  if (!good) return false;
  out = {Kind::Task, std::stoll(digits)};
  return true;
}

}  // namespace thetad::config

namespace thetad::config::detail {

namespace {

#define THETAD_FIELD(section, key, type, expr, fp) \
  Field { section, key, ValueType::type, [](Job& j) -> void* { return &(j.expr); }, fp }

// An enum key: the member's type picks the YAML words.
#define THETAD_ENUM_FIELD(section, key, expr)                                              \
  Field {                                                                                  \
    section, key, ValueType::Enum, [](Job& j) -> void* { return &(j.expr); }, true,       \
        [](void* m, const std::string& w) {                                                \
          return from_string(w, *static_cast<decltype(std::declval<Job&>().expr)*>(m));    \
        },                                                                                 \
        [](const void* m) -> const std::string& {                                          \
          return to_string(*static_cast<const decltype(std::declval<Job&>().expr)*>(m));   \
        }                                                                                  \
  }

const std::vector<Field> kFields = {
    THETAD_FIELD("", "job", String, name, true),
    THETAD_FIELD("", "seed", UInt, seed, true),
    THETAD_FIELD("", "steps", Int, steps, true),
    THETAD_FIELD("", "accumulate_steps", Int, accumulate_steps, true),
    THETAD_ENUM_FIELD("", "precision", precision),

    THETAD_ENUM_FIELD("model", "kind", model.kind),
    THETAD_FIELD("model", "input_dim", Int, model.input_dim, true),
    THETAD_FIELD("model", "hidden", Int, model.hidden, true),
    THETAD_FIELD("model", "output_dim", Int, model.output_dim, true),
    THETAD_FIELD("model", "trunk_layers", Int, model.trunk_layers, true),
    THETAD_FIELD("model", "head_layers", Int, model.head_layers, true),
    THETAD_FIELD("model", "tasks", Int, model.tasks, true),
    THETAD_FIELD("model", "adapter_rank", Int, model.adapter_rank, true),
    THETAD_FIELD("model", "classes", Int, model.classes, true),
    THETAD_FIELD("model", "negatives_per_step", Int, model.negatives_per_step, true),
    THETAD_FIELD("model", "path", String, model.path, true),
    THETAD_FIELD("model", "trust_code", Bool, model.trust_code, true),
    THETAD_FIELD("model", "shared", StringList, model.shared, true),
    THETAD_FIELD("model", "task", Patterns, model.task, true),
    THETAD_FIELD("model", "init_seed", Int, model.init_seed, true),
    THETAD_FIELD("model", "init_from", String, model.init_from, true),
    THETAD_FIELD("model", "layers", Int, model.layers, true),
    THETAD_FIELD("model", "d_model", Int, model.d_model, true),
    THETAD_FIELD("model", "heads", Int, model.heads, true),
    THETAD_FIELD("model", "d_ff", Int, model.d_ff, true),
    THETAD_FIELD("model", "vocab", Int, model.vocab, true),
    THETAD_FIELD("model", "seq_len", Int, model.seq_len, true),
    THETAD_ENUM_FIELD("model", "arch", model.arch),
    THETAD_FIELD("model", "kv_heads", Int, model.kv_heads, true),
    THETAD_FIELD("model", "rope_theta", Double, model.rope_theta, true),
    THETAD_FIELD("model", "head_dim", Int, model.head_dim, true),
    THETAD_ENUM_FIELD("model", "rope_scaling", model.rope_scaling),
    THETAD_FIELD("model", "rope_factor", Double, model.rope_factor, true),
    THETAD_FIELD("model", "rope_low_freq_factor", Double, model.rope_low_freq_factor, true),
    THETAD_FIELD("model", "rope_high_freq_factor", Double, model.rope_high_freq_factor, true),
    THETAD_FIELD("model", "rope_original_max_positions", Int, model.rope_original_max_positions, true),
    THETAD_FIELD("model", "norm_eps", Double, model.norm_eps, true),
    THETAD_FIELD("model", "tie_embeddings", Bool, model.tie_embeddings, true),
    THETAD_FIELD("model", "train_shared", Bool, model.train_shared, true),
    THETAD_ENUM_FIELD("model", "base_quant", model.base_quant),
    THETAD_ENUM_FIELD("model", "base_shard", model.base_shard),

    THETAD_FIELD("lora", "rank", Int, lora.rank, true),
    THETAD_FIELD("lora", "alpha", Double, lora.alpha, true),
    THETAD_FIELD("lora", "targets", StringList, lora.targets, true),
    THETAD_FIELD("lora", "init_from", String, lora.init_from, true),

    THETAD_ENUM_FIELD("data", "kind", data.kind),
    THETAD_FIELD("data", "dir", String, data.dir, true),
    THETAD_ENUM_FIELD("data", "token_dtype", data.token_dtype),
    THETAD_FIELD("data", "batch_per_rank", Int, data.batch_per_rank, true),
    THETAD_ENUM_FIELD("data", "schedule", data.schedule),
    THETAD_FIELD("data", "tasks_per_rank", Int, data.tasks_per_rank, true),
    THETAD_FIELD("data", "weights", DoubleList, data.weights, true),
    THETAD_FIELD("data", "per_rank", IntListList, data.per_rank, true),
    THETAD_FIELD("data", "alternate", StringList, data.alternate, true),
    THETAD_FIELD("data", "noise", Double, data.noise, true),
    THETAD_FIELD("data", "loss_mask", Bool, data.loss_mask, true),

    THETAD_FIELD("eval", "dir", String, eval.dir, true),
    THETAD_FIELD("eval", "every_steps", Int, eval.every_steps, true),
    THETAD_FIELD("eval", "rows", Int, eval.rows, true),
    THETAD_FIELD("eval", "tasks", Patterns, eval.tasks, true),

    THETAD_ENUM_FIELD("comm", "backend", comm.backend),
    THETAD_FIELD("comm", "bucket_cap_mb", Double, comm.bucket_cap_mb, true),
    THETAD_FIELD("comm", "first_bucket_mb", Double, comm.first_bucket_mb, true),
    THETAD_FIELD("comm", "prune", Bool, comm.prune, true),
    THETAD_ENUM_FIELD("comm", "average", comm.average),
    THETAD_ENUM_FIELD("comm", "active", comm.active),
    THETAD_FIELD("comm", "timeout_s", Double, comm.timeout_s, true),
    THETAD_ENUM_FIELD("comm", "grad_dtype", comm.grad_dtype),
    THETAD_ENUM_FIELD("comm", "sole_user", comm.sole_user),

    THETAD_FIELD("offload", "enabled", Bool, offload.enabled, true),
    THETAD_FIELD("offload", "device_slots", Int, offload.device_slots, true),
    THETAD_FIELD("offload", "device_budget_mb", Double, offload.device_budget_mb, true),
    THETAD_FIELD("offload", "device_cache_mb", String, offload.device_cache_mb, true),
    THETAD_FIELD("offload", "prefetch", Int, offload.prefetch, true),
    THETAD_FIELD("offload", "shard_mb", Double, offload.shard_mb, true),
    THETAD_FIELD("offload", "host_limit_mb", Double, offload.host_limit_mb, true),
    THETAD_FIELD("offload", "cpu_threads", Int, offload.cpu_threads, false),
    THETAD_FIELD("offload", "activations", Bool, offload.activations, true),
    THETAD_ENUM_FIELD("offload", "shared", offload.shared),
    THETAD_FIELD("offload", "shared_prefetch_layers", Int, offload.shared_prefetch_layers, true),
    THETAD_FIELD("offload", "shared_device_layers", String, offload.shared_device_layers, true),
    THETAD_FIELD("offload", "shared_split_layers", String, offload.shared_split_layers, true),
    THETAD_ENUM_FIELD("offload", "h2d_dtype", offload.h2d_dtype),
    THETAD_ENUM_FIELD("offload", "host_groups", offload.host_groups),
    THETAD_ENUM_FIELD("offload", "uncached_update", offload.uncached_update),

    THETAD_ENUM_FIELD("optimizer", "kind", optimizer.kind),
    THETAD_FIELD("optimizer", "lr", Double, optimizer.lr, true),
    THETAD_FIELD("optimizer", "betas", Betas, optimizer, true),
    THETAD_FIELD("optimizer", "eps", Double, optimizer.eps, true),
    THETAD_FIELD("optimizer", "weight_decay", Double, optimizer.weight_decay, true),
    THETAD_FIELD("optimizer", "clip_norm", Double, optimizer.clip_norm, true),
    THETAD_FIELD("optimizer", "warmup_steps", Int, optimizer.warmup_steps, true),
    THETAD_ENUM_FIELD("optimizer", "lr_schedule", optimizer.lr_schedule),
    THETAD_FIELD("optimizer", "min_lr", Double, optimizer.min_lr, true),
    THETAD_FIELD("optimizer", "overlap", Bool, optimizer.overlap, true),

    THETAD_ENUM_FIELD("train", "on_nonfinite", train.on_nonfinite),
    THETAD_ENUM_FIELD("train", "backward", train.backward),
    THETAD_FIELD("train", "tasks_per_pass", Int, train.tasks_per_pass, true),
    THETAD_FIELD("train", "cuda_graphs", Bool, train.cuda_graphs, true),

    THETAD_FIELD("checkpoint", "dir", String, checkpoint.dir, true),
    THETAD_FIELD("checkpoint", "every_steps", Int, checkpoint.every_steps, true),
    THETAD_FIELD("checkpoint", "keep", Int, checkpoint.keep, true),
    THETAD_FIELD("checkpoint", "async", Bool, checkpoint.async, true),

    // Per-rank output settings: ranks may differ, so they stay out of the fingerprint.
    THETAD_FIELD("metrics", "path", String, metrics.path, false),
    THETAD_FIELD("metrics", "all_ranks", Bool, metrics.all_ranks, true),

    THETAD_FIELD("log", "level", String, log.level, false),
    THETAD_FIELD("log", "file", String, log.file, false),
    THETAD_FIELD("log", "progress_every_s", Double, log.progress_every_s, false),

    THETAD_FIELD("timeline", "path", String, timeline.path, false),

    THETAD_FIELD("export", "adapters_dir", String, export_.adapters_dir, true),
    THETAD_FIELD("export", "at_checkpoints", Bool, export_.at_checkpoints, true),
    THETAD_FIELD("export", "base_model", String, export_.base_model, true),
    THETAD_ENUM_FIELD("export", "best", export_.best),
    THETAD_ENUM_FIELD("export", "dtype", export_.dtype),
    THETAD_FIELD("export", "merged_dir", String, export_.merged_dir, true),
    THETAD_FIELD("export", "merged_tasks", IntList, export_.merged_tasks, true),
    THETAD_FIELD("export", "max_shard_mb", Double, export_.max_shard_mb, true),
};

#undef THETAD_FIELD
#undef THETAD_ENUM_FIELD

const std::vector<std::string> kSections = {"model",     "lora",  "data",       "eval",    "comm",    "offload",
                                            "optimizer", "train", "checkpoint", "metrics", "log",
                                            "timeline",  "export"};

const std::map<std::string, std::vector<std::string>> kEnums = {
    {"precision", words<Precision>()},
    {"model.kind", words<ModelKind>()},
    {"data.kind", words<DataKind>()},
    {"data.schedule", words<ScheduleKind>()},
    {"comm.backend", words<Backend>()},
    {"comm.average", words<Average>()},
    {"comm.active", words<Active>()},
    {"comm.grad_dtype", words<GradDtype>()},
    {"comm.sole_user", words<SoleUser>()},
    {"optimizer.kind", words<OptimizerKind>()},
    {"optimizer.lr_schedule", words<LrSchedule>()},
    {"train.on_nonfinite", words<NonFinite>()},
    {"train.backward", words<Backward>()},
    {"offload.shared", words<SharedMode>()},
    {"offload.h2d_dtype", words<H2dDtype>()},
    {"offload.host_groups", words<HostGroups>()},
    {"offload.uncached_update", words<UncachedUpdate>()},
    {"model.arch", words<ModelArch>()},
    {"model.rope_scaling", words<RopeScaling>()},
    {"model.base_quant", words<BaseQuant>()},
    {"model.base_shard", words<BaseShard>()},
    {"export.dtype", words<ExportDtype>()},
    {"data.token_dtype", words<TokenDtype>()},
    {"export.best", words<ExportPick>()},
    {"log.level", {"trace", "debug", "info", "warn", "error", "critical", "off"}},
};

bool plain_safe(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' ||
                    c == '.' || c == '/';
    if (!ok) return false;
  }
  // Words other YAML readers take for booleans or null.
  std::string lower;
  for (char c : s) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* w : {"true", "false", "yes", "no", "on", "off", "y", "n", "null"})
    if (lower == w) return false;
  return true;
}

template <typename T>
const T& get(const Field& f, const Job& job) {
  // Reading only: the accessor table is shared with the parser, which writes.
  return *static_cast<const T*>(f.member(const_cast<Job&>(job)));
}

}  // namespace

std::string Field::path() const {
  return section[0] == '\0' ? std::string(key) : std::string(section) + "." + key;
}

const std::vector<Field>& fields() { return kFields; }
const std::vector<std::string>& section_names() { return kSections; }

bool is_section(const std::string& name) {
  for (const auto& s : kSections)
    if (s == name) return true;
  return false;
}

std::vector<std::string> keys_of(const std::string& section) {
  std::vector<std::string> keys;
  for (const auto& f : kFields)
    if (section == f.section) keys.emplace_back(f.key);
  if (section.empty()) keys.insert(keys.end(), kSections.begin(), kSections.end());
  return keys;
}

std::vector<std::string> all_paths() {
  std::vector<std::string> paths;
  for (const auto& f : kFields) paths.push_back(f.path());
  return paths;
}

const Field* find_field(const std::string& section, const std::string& key) {
  for (const auto& f : kFields)
    if (section == f.section && key == f.key) return &f;
  return nullptr;
}

const std::vector<std::string>* allowed_values(const std::string& path) {
  const auto it = kEnums.find(path);
  return it == kEnums.end() ? nullptr : &it->second;
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

std::string format_double(double v) {
  if (!std::isfinite(v)) return v != v ? ".nan" : (v > 0 ? ".inf" : "-.inf");
  char buf[40];
  if (v == std::trunc(v) && std::fabs(v) < 1e15) {  // 300, not 3e+02
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    double back = 0;
    const auto res = std::from_chars(buf, buf + std::char_traits<char>::length(buf), back);
    if (res.ec == std::errc() && back == v) break;
  }
  std::string out = buf;
  // "1e-08" is a string to YAML 1.1 readers (PyYAML); "1.0e-08" is a float to all of them.
  const auto e = out.find('e');
  if (e != std::string::npos && out.find('.') == std::string::npos) out.insert(e, ".0");
  return out;
}

std::string format_string(const std::string& s) {
  if (plain_safe(s)) return s;
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char esc[8];
          std::snprintf(esc, sizeof esc, "\\x%02x", static_cast<unsigned>(c));
          out += esc;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string format_value(const Field& f, const Job& job) {
  switch (f.type) {
    case ValueType::Int: return std::to_string(get<int64_t>(f, job));
    case ValueType::UInt: return std::to_string(get<uint64_t>(f, job));
    case ValueType::Double: return format_double(get<double>(f, job));
    case ValueType::Bool: return get<bool>(f, job) ? "true" : "false";
    case ValueType::String: return format_string(get<std::string>(f, job));
    case ValueType::Enum: return format_string(f.word(f.member(const_cast<Job&>(job))));
    case ValueType::Patterns:
      if (get<std::vector<std::string>>(f, job).size() == 1)
        return format_string(get<std::vector<std::string>>(f, job)[0]);
      [[fallthrough]];
    case ValueType::StringList: {
      std::vector<std::string> items;
      for (const auto& s : get<std::vector<std::string>>(f, job)) items.push_back(format_string(s));
      return "[" + join(items) + "]";
    }
    case ValueType::DoubleList: {
      std::vector<std::string> items;
      for (double d : get<std::vector<double>>(f, job)) items.push_back(format_double(d));
      return "[" + join(items) + "]";
    }
    case ValueType::IntList: {
      std::vector<std::string> items;
      for (int64_t v : get<std::vector<int64_t>>(f, job)) items.push_back(std::to_string(v));
      return "[" + join(items) + "]";
    }
    case ValueType::IntListList: {
      std::vector<std::string> rows;
      for (const auto& row : get<std::vector<std::vector<int64_t>>>(f, job)) {
        std::vector<std::string> items;
        for (int64_t t : row) items.push_back(std::to_string(t));
        rows.push_back("[" + join(items) + "]");
      }
      return "[" + join(rows) + "]";
    }
    case ValueType::Betas: {
      const auto& o = get<OptimizerConfig>(f, job);
      return "[" + format_double(o.beta1) + ", " + format_double(o.beta2) + "]";
    }
  }
  return "";
}

}  // namespace thetad::config::detail
