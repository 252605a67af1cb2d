// Where each parameter group lives, decided once from the job and the world before anything is
// built, and the facts that follow from it: where the model is built, whether task groups are
// drawn lazily by a host store, whether a frozen base is held in bf16, whether output layers are
// streamed in row shards, which resident groups the replica rule may keep and which backward
// train.backward: auto prefers. The homes are built from it (daemon/homes/homes.cpp), the
// memory estimates count each home's terms by it, the models and the streamed base are handed it
// (a frozen base in bf16, the classifier's row shards), and nothing else decides these from job
// keys.
#pragma once

#include <cstdint>
#include <vector>

#include "config/job.hpp"

namespace thetad::daemon {

enum class HomeKind {
  resident,        // on the device for the whole run (ResidentHome)
  host_store,      // θ[t] in the host store, through device slots and lines (offload.enabled: StoreHome)
  streamed_trunk,  // Θ in a host store of its own, layer by layer (offload.shared: stream: StreamedTrunk)
};
const char* to_string(HomeKind kind);

struct Placement {
  HomeKind shared = HomeKind::resident;  // Θ's home (group 0)
  HomeKind tasks = HomeKind::resident;   // every θ[t]'s home (groups 1..T)
  // The model is built on the host: a host store takes some of its groups (θ[t] never lives on
  // the device whole; the resident ones are moved there once the homes exist).
  bool model_on_host = false;
  // Task groups are placeholders until the host store draws their values in its arena.
  bool lazy_tasks = false;
  // A frozen base held in bf16 (precision: bf16, model.train_shared: false, Θ resident, a built-in
  // model): never updated, so it needs no float32 master, and autocast rounds every read of its
  // matrices to bf16 anyway. Held so, a matrix that forward reads only through autocast's casts
  // (linear, matmul, addmm) gives the very bits the float32 one gives; the model keeps the others
  // (norms, positions; embeddings unless their values are bf16 already) in float32.
  bool frozen_base_bf16 = false;
  // A drawn base quantized at load (model.base_quant without model.init_from): its matrices are
  // placeholders the model draws as it quantizes them, never held whole anywhere, and Θ is never
  // written to a checkpoint (the seed draws it again).
  bool drawn_quantized_base = false;
  // A transformer's frozen base whose layers come onto the device one at a time (StreamedBase):
  // streamed from host memory (offload.shared: stream), or gathered from the node's devices, each
  // of which holds 1/N of every layer (model.base_shard: node: sharded_base). Its layers'
  // matrices are in host memory shared by the node's ranks; its norms, embeddings and output
  // layer in Θ's resident home.
  bool streamed_base = false;
  bool sharded_base = false;
  // The extreme classifier's output slices are one [rows x (hidden+1)] parameter each, computed
  // (and, offloaded, stored and reduced) in row shards of offload.shard_mb (model row_chunked).
  bool row_shards = false;
  // Task groups the schedule never uses are not held at all (the host store with
  // offload.host_groups: scheduled): they stay at their initial values, drawn again from their sources.
  bool unheld_tasks = false;
  // train.backward: auto prefers a pass per task: Θ takes no gradient and is not streamed, so the
  // passes only split the work (a model that fuses tasks still runs them joint where they fit).
  bool split_passes = false;
  // Per group (size T+1): resident groups with a gradient the replica rule may keep on their one
  // trainer (from 2 ranks on, with comm.sole_user: keep).
  std::vector<uint8_t> replica_keepable;

  static Placement of(const config::Job& job, int world_size);

  HomeKind home(int g) const { return g == 0 ? shared : tasks; }
  // Some group lives in a host store.
  bool host_store() const { return model_on_host; }
  // train.backward (`key`) resolved: a forward and a backward per task. `fuse`: the model runs a
  // micro-step's tasks fused through its shared layers and that joint pass fits the device.
  bool backward_per_task(config::Backward key, bool fuse) const;
};

}  // namespace thetad::daemon
