// Validation of offload.shared (the shared trunk Θ streamed layer by layer from a host store):
// what it needs of the model and the optimizer, and the prefetch window against the trunk.
// Called from validate.cpp's offload checks; reported through Diagnostics like every key.
#include <string>

#include "config/schema.hpp"
#include "config/validate.hpp"

namespace thetad::config::detail {

void validate_shared(const Job& j, Diagnostics& d) {
  const OffloadConfig& o = j.offload;
  const auto fail = [&](const std::string& path, const std::string& what, const std::string& anchor = "") {
    if (d.bad(path) || (!anchor.empty() && d.bad(anchor))) return;
    d.error(path, what, anchor);
  };
  if (o.shared_prefetch_layers < 1)
    fail("offload.shared_prefetch_layers", "must be >= 1, got " + std::to_string(o.shared_prefetch_layers));
  if (o.shared != SharedMode::Stream || d.bad("offload.shared") || d.unknown_word("offload.shared")) return;
  // Only multitask_mlp's trunk is built of layers the store can stream (trunk.<i>.weight/bias,
  // one store group each); the other models keep Θ on the device.
  if (d.unknown_word("model.kind") || d.bad("model.kind")) return;
  if (j.model.kind != ModelKind::MultitaskMlp) {
    fail("offload.shared", "stream is for model.kind multitask_mlp (its trunk layers are streamed); model.kind is '" +
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

}  // namespace thetad::config::detail
