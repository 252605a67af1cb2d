// Placement (see placement.hpp): every condition that decides where a group lives, once.
#include "daemon/plan/placement.hpp"

namespace thetad::daemon {

const char* to_string(HomeKind kind) {
  switch (kind) {
    case HomeKind::resident: return "resident";
    case HomeKind::host_store: return "host store";
    case HomeKind::streamed_trunk: return "streamed trunk";
  }
  return "?";
}

namespace {

// offload.shared: stream on a transformer streams its frozen base's matrices (StreamedBase) and
// keeps the rest of Θ resident; on the MLP it streams the whole trunk, trained or not.
bool streams_frozen_base(const config::Job& job) {
  return job.offload.shared == config::SharedMode::Stream && job.model.kind == config::ModelKind::Transformer;
}

// model.base_shard: node gathers the frozen base's layers from the node's devices into the same
// slots a streamed base is copied into.
bool shards_frozen_base(const config::Job& job) {
  return job.model.base_shard == config::BaseShard::Node && job.model.kind == config::ModelKind::Transformer;
}

HomeKind shared_home(const config::Job& job) {
  return job.offload.shared == config::SharedMode::Stream && !streams_frozen_base(job) ? HomeKind::streamed_trunk
                                                                                         : HomeKind::resident;
}

HomeKind task_home(const config::Job& job) { return job.offload.enabled ? HomeKind::host_store : HomeKind::resident; }

}  // namespace

Placement Placement::of(const config::Job& job, int world_size) {
  Placement p;
  p.shared = shared_home(job);
  p.tasks = task_home(job);
  p.sharded_base = shards_frozen_base(job);
  p.streamed_base = streams_frozen_base(job) || p.sharded_base;
  p.model_on_host = p.shared != HomeKind::resident || p.tasks != HomeKind::resident || p.streamed_base;
  p.lazy_tasks = p.tasks == HomeKind::host_store;
  p.unheld_tasks = p.tasks == HomeKind::host_store && job.offload.host_groups == config::HostGroups::Scheduled;
  // A TorchScript model's forward is its own: nothing says which of its parameters reach autocast
  // only. Streamed Θ lives in a float32 host store of its own.
  p.frozen_base_bf16 = job.precision == config::Precision::Bf16 && !job.model.train_shared &&
                       p.shared == HomeKind::resident && job.model.kind != config::ModelKind::Torchscript;
  p.drawn_quantized_base = job.model.base_quant != config::BaseQuant::None && job.model.init_from.empty();
  p.row_shards = job.model.kind == config::ModelKind::ExtremeClassifier && job.offload.shard_mb > 0;
  // A trained Θ would accumulate over the passes in another order, and a streamed trunk or base
  // would stream its layers once per pass.
  p.split_passes = !job.model.train_shared && p.shared != HomeKind::streamed_trunk && !p.streamed_base;
  p.replica_keepable.assign(static_cast<size_t>(job.model.tasks) + 1, 0);
  if (world_size >= 2 && job.comm.sole_user == config::SoleUser::Keep) {
    p.replica_keepable[0] = p.shared == HomeKind::resident && job.model.train_shared ? 1 : 0;
    for (size_t g = 1; g < p.replica_keepable.size(); ++g) p.replica_keepable[g] = p.tasks == HomeKind::resident ? 1 : 0;
  }
  return p;
}

bool Placement::backward_per_task(config::Backward key, bool fuse) const {
  switch (key) {
    case config::Backward::Joint: return false;
    case config::Backward::PerTask: return true;
    case config::Backward::Auto: break;
  }
  return split_passes && !fuse;
}

}  // namespace thetad::daemon
