// The offload section of a job (Checker, checker.hpp): the θ[t] store's slots, the device cache,
// activations and row shards; and offload.shared (the shared trunk Θ streamed layer by layer from
// a host store): what it needs of the model and the optimizer, and the prefetch window.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "config/checker.hpp"
#include "config/validate.hpp"

namespace thetad::config::detail {

namespace {

// offload.shared: stream on the transformer streams its frozen base's layers (the adapters train
// on it); a trained base would need its gradients and optimizer state streamed as the MLP's are.
void streamed_base(const Job& j, Diagnostics& d) {
  const OffloadConfig& o = j.offload;
  const auto fail = [&](const std::string& path, const std::string& what, const std::string& anchor = "") {
    if (d.bad(path) || (!anchor.empty() && d.bad(anchor))) return;
    d.error(path, what, anchor);
  };
  if (j.model.train_shared)
    fail("offload.shared", "stream of a transformer streams its frozen base, but model.train_shared is true: set "
                           "model.train_shared: false (adapters on a frozen base) or offload.shared to resident",
         "model.train_shared");
  for (const auto& [key, v] : {std::pair<const char*, const std::string*>{"offload.shared_device_layers",
                                                                          &o.shared_device_layers},
                               {"offload.shared_split_layers", &o.shared_split_layers}})
    if (*v != "0")
      fail(key, std::string("is the streamed MLP trunk's (its layers' updates); a transformer's streamed base is "
                            "frozen: leave it at 0, got \"") + *v + "\"", "offload.shared");
  const int64_t layers = j.model.layers;
  if (layers >= 1 && o.shared_prefetch_layers > layers - 1 && !d.bad("model.layers"))
    fail("offload.shared_prefetch_layers",
         "prefetches " + std::to_string(o.shared_prefetch_layers) + " layers ahead, but the base has " +
             std::to_string(layers) + " layers (model.layers), so at most " + std::to_string(layers - 1) +
             (layers == 1 ? " (a base of one layer has nothing to prefetch: set offload.shared to resident)" : ""),
         "offload.shared");
}

}  // namespace

void validate_shared(const Job& j, Diagnostics& d) {
  const OffloadConfig& o = j.offload;
  const auto fail = [&](const std::string& path, const std::string& what, const std::string& anchor = "") {
    if (d.bad(path) || (!anchor.empty() && d.bad(anchor))) return;
    d.error(path, what, anchor);
  };
  if (o.shared_prefetch_layers < 1)
    fail("offload.shared_prefetch_layers", "must be >= 1, got " + std::to_string(o.shared_prefetch_layers));
  // "auto" or a whole number (YAML gives it to the string key as written).
  for (const auto& [key, value] : {std::pair<const char*, const std::string*>{"offload.shared_device_layers",
                                                                              &o.shared_device_layers},
                                   {"offload.shared_split_layers", &o.shared_split_layers}}) {
    const std::string& v = *value;
    char* end = nullptr;
    const long long count = std::strtoll(v.c_str(), &end, 10);
    if (v != "auto" && (v.empty() || end != v.c_str() + v.size()))
      fail(key, "expected auto or a whole number of layers, got \"" + v + "\"");
    else if (v != "auto" && count < 0)
      fail(key, "must be >= 0, got " + v);
  }
  const std::string& dl = o.shared_device_layers;
  if (o.shared != SharedMode::Stream || d.bad("offload.shared") || d.unknown_word("offload.shared")) return;
  // Only multitask_mlp's trunk is built of layers the store can stream (trunk.<i>.weight/bias,
  // one store group each); the other models keep Θ on the device.
  if (d.unknown_word("model.kind") || d.bad("model.kind")) return;
  if (j.model.kind == ModelKind::Transformer) {
    streamed_base(j, d);
    return;
  }
  if (j.model.kind != ModelKind::MultitaskMlp) {
    fail("offload.shared", "stream is for model.kind multitask_mlp (its trunk layers are streamed) and transformer "
                           "(its frozen base's layers); model.kind is '" +
                               to_string(j.model.kind) + "': set offload.shared to resident", "model.kind");
    return;
  }
  const int64_t layers = j.model.trunk_layers;
  if (layers < 1) {
    fail("offload.shared", "stream needs trunk layers to stream; model.trunk_layers is " + std::to_string(layers) +
                               " (set offload.shared to resident or model.trunk_layers >= 1)", "model.trunk_layers");
    return;
  }
  if (o.shared_prefetch_layers > layers - 1 && !d.bad("model.trunk_layers"))
    fail("offload.shared_prefetch_layers",
         "prefetches " + std::to_string(o.shared_prefetch_layers) + " layers ahead, but the trunk has " +
             std::to_string(layers) + " layers (model.trunk_layers), so at most " + std::to_string(layers - 1) +
             (layers == 1 ? " (a trunk of one layer has nothing to prefetch: set offload.shared to resident)" : ""),
         "offload.shared");
  if (o.shared_device_layer_count() >= layers && !d.bad("model.trunk_layers"))
    fail("offload.shared_device_layers",
         "keeps " + dl + " trunk layers on the device, but the trunk has " +
             std::to_string(layers) + " layers (model.trunk_layers), so nothing would stream: at most " +
             std::to_string(layers - 1) + ", or set offload.shared to resident",
         "offload.shared");
  if (o.shared_device_layer_count() + o.shared_split_layer_count() > layers && !d.bad("model.trunk_layers") &&
      !d.bad("offload.shared_device_layers"))
    fail("offload.shared_split_layers",
         "updates " + o.shared_split_layers + " streamed layers on the device, but the trunk has " +
             std::to_string(layers) + " layers (model.trunk_layers) of which " + dl +
             " stay on the device (offload.shared_device_layers): at most " +
             std::to_string(std::max<int64_t>(0, layers - o.shared_device_layer_count())),
         "offload.shared");
  // The host store steps Adam/AdamW per layer; clipping by Θ's norm would need the norm across
  // the layers (and their owners) before any layer's step.
  if (!d.unknown_word("optimizer.kind") && j.optimizer.kind == OptimizerKind::Sgd)
    fail("offload.shared", "stream: the host store steps Adam/AdamW only; set optimizer.kind to adam or adamw, "
                           "or offload.shared to resident", "optimizer.kind");
  if (j.optimizer.clip_norm > 0)
    fail("offload.shared", "stream steps Θ layer by layer on the host and cannot clip by Θ's whole norm; "
                           "optimizer.clip_norm is " + format_double(j.optimizer.clip_norm) +
                           " (set it to 0 or offload.shared to resident)", "optimizer.clip_norm");
}

void Checker::offload() {
  const OffloadConfig& o = j_.offload;
  at_least<int64_t>("offload.device_slots", o.device_slots, 1);
  at_least("offload.device_budget_mb", o.device_budget_mb, 0.0);
  at_least<int64_t>("offload.prefetch", o.prefetch, 0);
  at_least("offload.shard_mb", o.shard_mb, 0.0);
  at_least("offload.host_limit_mb", o.host_limit_mb, 0.0);
  at_least<int64_t>("offload.cpu_threads", o.cpu_threads, 0);
  at_most<int64_t>("offload.prefetch", o.prefetch, kMaxPrefetch, "steps planned ahead at every step");
  at_most<int64_t>("offload.cpu_threads", o.cpu_threads, kMaxCpuThreads, "threads of one rank");
  for (const auto& [key, v] : {std::pair<const char*, double>{"offload.device_budget_mb", o.device_budget_mb},
                               {"offload.shard_mb", o.shard_mb}, {"offload.host_limit_mb", o.host_limit_mb}})
    at_most(key, v, kMaxMiB, "1 PiB");
  device_cache(o.device_cache_mb);
  if (o.shard_mb > 0 && o.shard_mb <= kMaxMiB && ok("offload.shard_mb") && ok("model.kind")) shards();
  if (o.enabled && o.device_budget_mb == 0 && ok("offload.device_budget_mb") && ok("offload.enabled"))
    slots_cover_step();
  if (o.activations && ok("offload.activations") && ok("model.kind")) activations();
  if (o.enabled && is("optimizer.kind", j_.optimizer.kind, OptimizerKind::Sgd))
    fail("offload.enabled", "the host store steps Adam/AdamW only; set optimizer.kind to adam or "
                            "adamw, or offload.enabled to false", "optimizer.kind");
  one_of("offload.shared");
  one_of("offload.h2d_dtype");
  one_of("offload.host_groups");
  one_of("offload.uncached_update");
  // bf16 copies feed bf16 compute; an fp32 or tf32 job would compute on rounded weights.
  if (is("offload.h2d_dtype", o.h2d_dtype, H2dDtype::Bf16) && !unknown("precision") &&
      j_.precision != Precision::Bf16)
    fail("offload.h2d_dtype", "bf16 copies are for precision: bf16 (the device would compute in " +
                                  to_string(j_.precision) + " on weights rounded to bf16); precision is " +
                                  to_string(j_.precision) + ": set offload.h2d_dtype to fp32",
         "precision");
  validate_shared(j_, d_);
}

// What the store will refuse once the model is built, said by `validate` already (a lower bound:
// the store adds alignment): a device cache (device_cache_mb in MiB) too small for one line of
// the largest task group (its parameters and Adam m and v, 12 bytes each), and a host arena of
// every task group (16 bytes per parameter: values, m, v, the gradient's landing area) above
// host_limit_mb. `per_task`: the largest task group's parameters; `tasks_total`: all of them.
void Checker::offload_sizes(double shared, double per_task, double tasks_total) {
  counts_ = {true, shared, per_task, tasks_total};
  const OffloadConfig& o = j_.offload;
  if (!o.enabled || !ok("offload.enabled") || per_task <= 0) return;
  const std::string& v = o.device_cache_mb;
  char* end = nullptr;
  const double cache_mib = v == "auto" ? 0 : std::strtod(v.c_str(), &end);
  const bool row_sharded = j_.model.kind == ModelKind::ExtremeClassifier && o.shard_mb > 0;  // no cache lines
  if (cache_mib > 0 && cache_mib <= kMaxMiB && ok("offload.device_cache_mb") && !row_sharded &&
      12 * per_task > double(mib_to_bytes(cache_mib)))
    fail("offload.device_cache_mb", v + " MiB holds no task group: one line (a group's parameters and Adam m and v) "
                                        "is at least " + num(12 * per_task) + " bytes (the largest task group: " +
                                        num(per_task) + " parameters x 12 bytes); raise it, or set 0 for no cache");
  if (o.host_limit_mb > 0 && ok("offload.host_limit_mb") && o.host_groups == HostGroups::All &&
      16 * tasks_total > double(mib_to_bytes(o.host_limit_mb)))
    fail("offload.host_limit_mb", "is " + num(o.host_limit_mb) + " MiB but the host arena of the task groups needs at "
                                  "least " + num(16 * tasks_total / 1048576.0) + " MiB (" + num(tasks_total) +
                                  " parameters x 16 bytes: values, Adam m and v, the gradient's landing area); raise "
                                  "it, or hold only the groups the schedule uses (offload.host_groups: scheduled)");
}

// "auto" or a size in MiB: a number written as one (YAML gives it to the string key as is).
void Checker::device_cache(const std::string& v) {
  if (v == "auto") return;
  char* end = nullptr;
  const double mib = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !(mib >= 0) || mib > kMaxMiB)
    fail("offload.device_cache_mb", "expected auto or a size in MiB from 0 to 1 PiB, got \"" + v + "\"");
}

// Every task group a rank uses in an optimizer step (the union over its micro-steps) is held in
// a device slot from the step's start to its optimizer step (daemon/store_bridge prepare_step),
// so device_slots (no device_budget_mb) must cover the most groups a step can use. Round robin:
// the worst case over world sizes (exact with one rank). Row-sharded groups (extreme_classifier
// with shard_mb) stream their shards instead; the store checks their 2 slots.
void Checker::slots_cover_step() {
  const int64_t slots = j_.offload.device_slots;
  const int64_t T = j_.model.tasks, k = j_.data.tasks_per_rank, A = j_.accumulate_steps;
  const DataConfig& dc = j_.data;
  if (!ok("offload.device_slots") || slots < 1 || !ok("model.tasks") || T < 1 || T > kMaxTasks ||
      !ok("accumulate_steps") || A < 1 || A > kMaxAccumulateSteps || !ok("data.schedule") ||
      unknown("data.schedule") || !ok("model.kind") || unknown("model.kind"))
    return;
  if (j_.model.kind == ModelKind::ExtremeClassifier && j_.offload.shard_mb > 0) return;
  int64_t groups = 0;
  std::string why;
  switch (dc.schedule) {
    case ScheduleKind::RoundRobin:
    case ScheduleKind::Weighted: {
      if (!ok("data.tasks_per_rank") || k < 1 || k > std::min(T, kMaxTasksPerRank)) return;
      int64_t distinct = T;  // weighted: a task of weight 0 is never drawn
      std::string cap = "model.tasks";
      if (dc.schedule == ScheduleKind::Weighted) {
        if (!ok("data.weights") || static_cast<int64_t>(dc.weights.size()) != T) return;
        distinct = std::count_if(dc.weights.begin(), dc.weights.end(), [](double w) { return w > 0; });
        cap = "the tasks of weight > 0";
      }
      groups = std::min(k * A, distinct);  // k, A <= 2^20: no overflow
      why = "data.tasks_per_rank x accumulate_steps = " + num(k) + " x " + num(A) + ", at most " + cap +
            " (" + num(distinct) + ")";
      break;
    }
    case ScheduleKind::PerRank:
      if (!ok("data.per_rank")) return;
      for (const auto& list : dc.per_rank) groups = std::max<int64_t>(groups, list.size());
      why = "the longest list of data.per_rank; the same tasks every micro-step";
      break;
    case ScheduleKind::All:
    case ScheduleKind::Alternate:
      groups = T;
      why = "every task, model.tasks";
      break;
  }
  if (slots < groups)
    fail("offload.device_slots",
         "is " + num(slots) + ", fewer than the " + num(groups) + " task groups a rank can use in one "
         "optimizer step with schedule '" + to_string(dc.schedule) + "' (" + why + "), all held on the "
         "device until the step's optimizer; raise it to >= " + num(groups) +
             " or set offload.device_budget_mb",
         "offload.enabled");
}

// Activation offload: the models whose trunk runs through trunk_layer, and the transformer's
// feed-forward activations (daemon/ops/). The others would keep every activation on the
// device, so the key is refused, not ignored.
void Checker::activations() {
  const ModelKind k = j_.model.kind;
  if (is("model.kind", k, ModelKind::MultitaskMlp) || is("model.kind", k, ModelKind::ExtremeClassifier) ||
      is("model.kind", k, ModelKind::Transformer))
    return;
  const std::string* word = unknown("model.kind");
  fail("offload.activations",
       "activation offload covers the trunk layers of model.kind multitask_mlp, the encoder of "
       "extreme_classifier and the transformer's feed-forward activations; '" + (word ? *word : to_string(k)) +
           "' keeps its activations on the device (use false)",
       "model.kind");
}

// Row shards inside a group: only the extreme classifier computes over them (its full softmax
// streams the slice in chunks of shard_mb), with or without offload.
void Checker::shards() {
  const ModelConfig& m = j_.model;
  if (!is("model.kind", m.kind, ModelKind::ExtremeClassifier)) {
    const std::string* word = unknown("model.kind");
    fail("offload.shard_mb", "row shards are computed by model.kind extreme_classifier only; '" +
                                 (word ? *word : to_string(m.kind)) +
                                 "' computes each task group whole (use 0)");
  } else if (ok("model.hidden") && m.hidden > 0 && m.hidden <= kMaxDim &&
             j_.offload.shard_bytes() < static_cast<size_t>(m.hidden + 1) * sizeof(float)) {
    fail("offload.shard_mb", "must hold one row of the output layer, (model.hidden + 1) x 4 = " +
                                 num(static_cast<int64_t>((m.hidden + 1) * 4)) + " bytes; got " +
                                 num(j_.offload.shard_mb) + " MiB");
  }
}

}  // namespace thetad::config::detail
