// The device memory a rank needs at least, checked before the model is built (see
// device_memory_estimate.hpp). Each term mirrors the code that allocates it (named beside it).
#include "daemon/plan/device_memory_estimate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <sstream>

#include "comm/node_split.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/test_hooks.hpp"
#include "config/lora_adapter.hpp"
#include "daemon/plan/memory_estimate.hpp"
#include "daemon/plan/placement.hpp"
#include "daemon/plan/schedule.hpp"
#include "offload/device.hpp"

namespace thetad::daemon {
namespace {

const auto count = format_count;

// The parameters validation counts are exact for the built-in models but the transformer's, whose
// count is an upper bound for both architectures; these are its lower bounds: Θ's matrices (the
// token embedding, the untied output layer, q k v o and the MLP; no norms, biases or positions),
// what of them forward reads through autocast's casts (all but the token embedding), and one
// task's LoRA adapters (r x (in + out) per targeted matrix; k and v narrower under llama's GQA).
// The other models' casts: their layers' matrices, not their biases (addmm does not keep a bias
// for backward): Θ's layers have hidden biases each, a head's output rows one per row of at least
// min(hidden, input_dim) weights.
struct Sizes {
  double shared = 0, shared_cast = 0, per_task = 0, smallest_task = 0, tasks_total = 0, task_cast = 1;
  double largest_cast = 0;  // the transformer: its largest joined projection (q, k, v or gate, up)
  double head_cast = 0;     // and its untied lm_head
};

Sizes sizes_of(const config::Job& job, const config::ParamCounts& c) {
  const config::ModelConfig& m = job.model;
  const double H = double(m.hidden), in = double(std::min(m.hidden, m.input_dim));
  const double layers = double(m.kind == config::ModelKind::MultitaskAdapter ? 1 + 2 * std::max<int64_t>(m.trunk_layers, 1)
                               : m.kind == config::ModelKind::ExtremeClassifier ? std::max<int64_t>(m.trunk_layers, 1)
                                                                                : m.trunk_layers);
  Sizes s{c.shared, std::max(0.0, c.shared - layers * H), c.per_task, 0, c.tasks_total, in / (in + 1)};
  // Task groups may differ in size (the extreme classifier's slices by a row): the others hold
  // at most per_task each, so the smallest holds at least what they leave of the total.
  s.smallest_task = std::max(0.0, c.tasks_total - double(m.tasks - 1) * c.per_task);
  if (m.kind != config::ModelKind::Transformer) return s;
  s.task_cast = 1;  // LoRA's matrices have no biases
  const bool llama = config::llama_family(m.arch);
  const double d = double(m.d_model), ff = double(m.d_ff), L = double(m.layers), V = double(m.vocab);
  // The attention's widths: heads (and key/value heads) x the head size (model.head_dim may set it).
  const config::LayerWidths w = config::layer_widths(m);
  const double q = double(w.q), kv = double(w.kv);
  const double layer = 2 * d * q + 2 * d * kv + (llama ? 3 : 2) * d * ff;
  s.shared = V * d + (m.tie_embeddings ? 0 : V * d) + L * layer;
  s.shared_cast = s.shared - V * d;
  s.largest_cast = std::max(d * (q + 2 * kv), (llama ? 2 : 1) * d * ff);
  s.head_cast = m.tie_embeddings ? 0 : V * d;
  s.per_task = s.smallest_task = config::LoraAdapter(job).elements();
  s.tasks_total = double(m.tasks) * s.per_task;
  return s;
}

const char* tasks_key(const config::Job& job) {
  return job.model.kind == config::ModelKind::ExtremeClassifier ? "model.classes" : "model.tasks";
}

const char* shared_key(const config::Job& job) {
  return job.model.kind == config::ModelKind::Transformer ? "model.d_model" : "model.hidden";
}

// The key behind the number of task groups one step uses.
const char* step_groups_key(const config::Job& job) {
  switch (job.data.schedule) {
    case config::ScheduleKind::RoundRobin:
    case config::ScheduleKind::Weighted: return "data.tasks_per_rank";
    case config::ScheduleKind::PerRank: return "data.per_rank";
    case config::ScheduleKind::All:
    case config::ScheduleKind::Alternate: break;
  }
  return "model.tasks";
}

// The θ[t] store's device slots (offload/store_plan.cpp plan_store): as many as device_slots, or
// as the budget holds, of the largest unit (a group, or with row shards a shard), at most one per
// unit (there are at least model.tasks units).
void add_task_slots(const config::Job& job, const Placement& place, const Sizes& s,
                    std::vector<DeviceMemoryTerm>& terms) {
  const config::OffloadConfig& o = job.offload;
  double slot = s.per_task * 4;
  if (place.row_shards) {
    const double row = double(job.model.hidden + 1) * 4;
    const double rows = std::ceil(double(job.model.classes) / double(job.model.tasks));
    const double per = rows * row > double(o.shard_bytes()) ? std::max(1.0, std::floor(double(o.shard_bytes()) / row)) : rows;
    slot = std::min(rows, per) * row;
  }
  if (slot <= 0) return;
  const bool budget = o.device_budget_bytes() > 0;
  double slots = budget ? std::floor(double(o.device_budget_bytes()) / slot) : double(o.device_slots);
  slots = std::max(1.0, std::min(slots, double(job.model.tasks)));
  const bool bf16 = o.h2d_dtype == config::H2dDtype::Bf16;
  const double bytes = slots * (slot + (bf16 ? slot / 2 + 2 : 0));  // ParamStore::alloc_slots
  terms.push_back({"the task groups' device slots " + format_bytes(bytes) + " (" + count(slots) + " x " +
                       format_bytes(slot) + (bf16 ? ", with their bf16 staging" : "") + ")",
                   static_cast<int64_t>(bytes), budget ? "offload.device_budget_mb" : "offload.device_slots"});
}

// Θ streamed from its host store (daemon/homes/streamed_trunk.cpp): layer slots, Θ's gradient
// buckets (which stay on the device), the layers kept on the device and the split's update lines.
void add_streamed_trunk(const config::Job& job, const Sizes& s, std::vector<DeviceMemoryTerm>& terms) {
  const config::ModelConfig& m = job.model;
  const config::OffloadConfig& o = job.offload;
  const double first = double(m.input_dim) * double(m.hidden) + double(m.hidden);
  const double layer = m.trunk_layers > 1 ? std::max(first, double(m.hidden) * double(m.hidden + 1)) : first;
  const double slots = double(std::min<int64_t>(o.shared_prefetch_layers + 2, std::max<int64_t>(m.trunk_layers, 1)));
  const bool bf16 = o.h2d_dtype == config::H2dDtype::Bf16;
  const double slot_bytes = slots * (layer * 4 + (bf16 ? layer * 2 + 2 : 0));
  terms.push_back({"Θ's layer slots " + format_bytes(slot_bytes) + " (" + count(slots) + " x " +
                       format_bytes(layer * 4) + (bf16 ? ", with their bf16 staging" : "") +
                       ": offload.shared_prefetch_layers + 2)",
                   static_cast<int64_t>(slot_bytes), "offload.shared_prefetch_layers"});
  terms.push_back({"Θ's gradient buckets " + format_bytes(s.shared * 4) + " (" + count(s.shared) + " x 4 B)",
                   static_cast<int64_t>(s.shared * 4), shared_key(job)});
  const double line = 12 * layer;  // a layer's values, m and v
  if (const int64_t n = o.shared_device_layer_count(); n > 0)
    terms.push_back({"Θ's layers kept on the device " + format_bytes(double(n) * line) + " (" + std::to_string(n) +
                         " x " + format_bytes(line) + ")",
                     static_cast<int64_t>(double(n) * line), "offload.shared_device_layers"});
  // A count, or auto (on a GPU: the lines are allocated whatever count the bandwidths pick).
  if (o.shared_split_layer_count() > 0 || o.shared_split_layers_auto()) {
    const double lines = double(o.shared_prefetch_layers + 2);
    terms.push_back({"the split's update lines " + format_bytes(lines * line) + " (" + count(lines) + " x " +
                         format_bytes(line) + ")",
                     static_cast<int64_t>(lines * line), "offload.shared_split_layers"});
  }
}

}  // namespace

int64_t DeviceMemoryNeed::total() const {
  int64_t sum = 0;
  for (const DeviceMemoryTerm& t : terms) sum += t.bytes;
  return sum;
}

std::string DeviceMemoryNeed::key() const {
  std::map<std::string, int64_t> by_key;
  for (const DeviceMemoryTerm& t : terms) by_key[t.key] += t.bytes;
  std::string best;
  int64_t most = -1;
  for (const DeviceMemoryTerm& t : terms)  // the first of equals, in the terms' order
    if (by_key[t.key] > most) most = by_key[t.key], best = t.key;
  return best;
}

std::string DeviceMemoryNeed::parts() const {
  std::string out;
  for (const DeviceMemoryTerm& t : terms) out += (out.empty() ? "" : " + ") + t.what;
  return out;
}

FirstStepGroups first_step_groups(const config::Job& job, int world_size, int rank) {
  FirstStepGroups f;
  std::unique_ptr<Schedule> schedule;
  try {
    schedule = Schedule::create(job, world_size);
  } catch (const ConfigError&) {
    return f;  // validate, counted for one rank, of a per_rank job for more: at least one group
  }
  const auto groups = [](const std::vector<uint8_t>& v) {
    return v.empty() ? int64_t{0} : static_cast<int64_t>(std::count(v.begin() + 1, v.end(), uint8_t{1}));
  };
  f.rank_used = groups(schedule->window_task_groups(0, job.accumulate_steps, rank));
  f.rank_trained_micro = groups(schedule->plan(0, rank).trained);
  // Every rank's, unless that would take long (the rank's own is a lower bound too).
  std::vector<uint8_t> any;
  const bool all_ranks = double(world_size) * double(job.accumulate_steps) * double(job.model.tasks) <= 1e7;
  for (int r = all_ranks ? 0 : rank; r <= (all_ranks ? world_size - 1 : rank); ++r)
    for (int64_t m = 0; m < job.accumulate_steps; ++m) {
      const std::vector<uint8_t> trained = schedule->plan(m, r).trained;
      any.resize(std::max(any.size(), trained.size()), 0);
      for (size_t g = 1; g < trained.size(); ++g) any[g] |= trained[g];
    }
  f.any_trained = groups(any);
  return f;
}

DeviceMemoryNeed device_memory_need(const config::Job& job, const config::ParamCounts& c,
                                    const FirstStepGroups& first, int node_ranks) {
  DeviceMemoryNeed need;
  if (!c.known) return need;
  need.known = true;
  const Sizes s = sizes_of(job, c);
  const Placement place = Placement::of(job, 1);
  const config::OffloadConfig& o = job.offload;
  const bool adam = job.optimizer.kind != config::OptimizerKind::Sgd;
  const bool bf16 = job.precision == config::Precision::Bf16;
  const bool train = job.model.train_shared;
  std::vector<DeviceMemoryTerm>& terms = need.terms;
  const auto add = [&](const std::string& what, double params, double bytes_each, const std::string& key) {
    if (params * bytes_each <= 0) return;
    terms.push_back({what + " " + format_bytes(params * bytes_each) + " (" + count(params) + " x " +
                         count(bytes_each) + " B)",
                     static_cast<int64_t>(params * bytes_each), key});
  };
  const std::string tkey = tasks_key(job), skey = shared_key(job), gkey = step_groups_key(job);

  // Θ, by its home. On the device (ResidentHome): its values (bf16 where the placement holds the
  // frozen base so), its gradient buckets (the engine's, for its lifetime), its Adam moments
  // (created at its first update) and, under bf16 autocast, the bf16 copies forward keeps for
  // backward. Streamed: its store's slots and lines.
  switch (place.shared) {
    case HomeKind::resident:
      if (job.model.base_quant == config::BaseQuant::Nf4 && !place.streamed_base) {
        // Its matrices in 4 bits and a bf16 absmax per 64 (daemon/ops/nf4.hpp), the largest
        // layer's once more, dequantized into the scratch every layer shares, and an untied
        // lm_head dequantized for a pass; the rest as held.
        add("Θ's matrices in nf4", s.shared_cast, kNf4BytesPerValue, "model.base_quant");
        add("their dequantization scratch", s.largest_cast, bf16 ? 2 : 4, "model.base_quant");
        add("lm_head dequantized for a pass", s.head_cast, bf16 ? 2 : 4, "model.base_quant");
        add("Θ's embedding", s.shared - s.shared_cast, place.frozen_base_bf16 ? 2 : 4, skey);
        break;
      }
      if (place.streamed_base) {
        // The layers' matrices in offload.shared_prefetch_layers + 2 slots of one layer each
        // (homes/streamed_base.hpp), sharded also 1/N of every layer; the embedding, norms and
        // output layer as held.
        // In nf4 the slots hold codes and absmax, and one scratch the largest matrix dequantized.
        const bool nf4 = job.model.base_quant == config::BaseQuant::Nf4;
        const double held = place.frozen_base_bf16 ? 2 : 4, moved = nf4 ? kNf4BytesPerValue : held;
        const double layers = s.shared_cast - s.head_cast;
        const double layer = layers / double(std::max<int64_t>(1, job.model.layers));
        const char* key = place.sharded_base ? "model.base_shard" : "offload.shared";
        add(place.sharded_base ? "Θ's gathered layer slots" : "Θ's streamed layer slots",
            layer * double(job.offload.shared_prefetch_layers + 2), moved, key);
        if (place.sharded_base)
          add("Θ's layers' shard (1/" + std::to_string(node_ranks) + ")", layers / double(std::max(1, node_ranks)),
              moved, key);
        if (nf4) add("their dequantization scratch", s.largest_cast, bf16 ? 2 : 4, "model.base_quant");
        add("Θ's embedding, norms and output layer", s.shared - s.shared_cast + s.head_cast, held, skey);
        break;
      }
      add("Θ's values", s.shared, place.frozen_base_bf16 ? 2 : 4, skey);
      if (train) {
        add("Θ's gradient buckets", s.shared, 4, skey);
        if (adam) add("Θ's Adam m and v", s.shared, 8, skey);
        if (bf16) add("Θ's bf16 copies for backward", s.shared_cast, 2, skey);
      }
      break;
    case HomeKind::streamed_trunk: add_streamed_trunk(job, s, terms); break;
    case HomeKind::host_store: break;  // never Θ's
  }

  // The task groups, by their home: on the device whole, or in the store's slots. Their
  // gradients come from a pool of buffers of the largest group, one per group the rank uses in a
  // step (comm/engine/grad_buffers.cpp), or, in row shards and resident, buckets of their own.
  const double used = double(first.rank_used), trained = double(first.rank_trained_micro),
               any = double(first.any_trained);
  const std::string of_first = " of the first step's ";
  switch (place.tasks) {
    case HomeKind::resident:
      add("the task groups' values (model.tasks = " + std::to_string(job.model.tasks) + ")", s.tasks_total, 4, tkey);
      if (place.row_shards) add("their gradient buckets", s.tasks_total, 4, tkey);
      // Moments of every group some rank used, each rank alike (ResidentHome::create_moments).
      if (adam) add("Adam m and v" + of_first + count(any) + " trained task group(s)", any * s.smallest_task, 8, gkey);
      break;
    case HomeKind::host_store: add_task_slots(job, place, s, terms); break;
    case HomeKind::streamed_trunk: break;  // never θ[t]'s
  }
  if (!place.row_shards)
    add("the gradient pool" + of_first + count(used) + " task group(s) on this rank", used * s.per_task, 4, gkey);
  if (bf16 && !place.row_shards)
    add("bf16 copies for backward of a micro-step's " + count(trained) + " trained task group(s)",
        trained * std::floor(s.smallest_task * s.task_cast), 2, gkey);

  const bool store = place.tasks == HomeKind::host_store;
  std::string later = "activations, workspace, the CUDA context and NCCL's buffers";
  if (store)
    later += o.device_cache_auto() ? ", the device cache (offload.device_cache_mb: auto, sized after the first step)"
                                   : ", the device cache (offload.device_cache_mb: as many lines as the device holds)";
  if (place.shared == HomeKind::streamed_trunk && o.shared_device_layers_auto())
    later += ", Θ's layers on the device (offload.shared_device_layers: auto)";
  if (!store && adam) later += ", the moments of groups first trained later";
  need.not_counted = later;
  return need;
}

void check_device_memory(const config::Job& job, const DeviceMemoryNeed& need, int64_t free_bytes,
                         int64_t total_bytes, const std::string& where) {
  if (!need.known || need.total() <= free_bytes) return;
  const std::string key = need.key();
  std::string hint = "lower " + key;
  if (Placement::of(job, 1).tasks == HomeKind::resident && key == tasks_key(job))
    hint += ", or keep the task groups in the host store (offload.enabled)";
  throw ConfigError(job.source + ": " + key + ": the job needs at least " + format_bytes(double(need.total())) +
                    " of device memory per rank, but " + where + " has " + format_bytes(double(free_bytes)) +
                    " free of " + format_bytes(double(total_bytes)) + ": " + need.parts() + "; " + hint + " (" +
                    need.not_counted + " come on top)");
}

bool device_memory_for_check(int gpu, void* compute_stream, int sharers, int64_t* free_bytes, int64_t* total_bytes,
                             std::string* where) {
  if (test_hooks::device_memory(free_bytes, total_bytes)) {
    *where = "the device of THETAD_TEST_DEVICE_MEMORY";
    return true;
  }
  if (gpu < 0) return false;
  size_t f = 0, t = 0;
  if (!offload::make_cuda_device(gpu, compute_stream, sharers)->memory(&f, &t)) return false;
  *free_bytes = static_cast<int64_t>(f);
  *total_bytes = static_cast<int64_t>(t);
  *where = "cuda:" + std::to_string(gpu) + (sharers > 1 ? " (this rank's share, 1/" + std::to_string(sharers) + ")" : "");
  return true;
}

namespace {

void check_job_fits_device(const config::Job& job, int world_size, int rank, int gpu, void* compute_stream,
                           int sharers, int node_ranks) {
  int64_t free_bytes = 0, total_bytes = 0;
  std::string where;
  if (!device_memory_for_check(gpu, compute_stream, sharers, &free_bytes, &total_bytes, &where)) return;
  if (world_size > 1) where += " of rank " + std::to_string(rank);
  const DeviceMemoryNeed need =
      device_memory_need(job, config::param_counts(job), first_step_groups(job, world_size, rank), node_ranks);
  if (rank == 0) {
    if (!need.known)
      THETAD_LOG(info, "memory") << "device memory: a TorchScript model is not counted; nothing checked";
    else
      THETAD_LOG(info, "memory") << "device memory: at least " << format_bytes(double(need.total())) << " per rank ("
                                 << need.parts() << "; " << need.not_counted << " on top); " << where << " has "
                                 << format_bytes(double(free_bytes)) << " free of " << format_bytes(double(total_bytes));
  }
  check_device_memory(job, need, free_bytes, total_bytes, where);
}

}  // namespace

void check_job_fits_device(const config::Job& job, comm::ControlPlane& plane, int world_size, int rank, int gpu,
                           void* compute_stream, int sharers) {
  std::exception_ptr error;
  try {
    // A node's ranks, for a sharded base's 1/N (the job's ranks over its nodes; every rank asks
    // alike: node_place is collective).
    const int nodes =
        job.model.base_shard == config::BaseShard::Node ? std::max(1, comm::node_place().nodes) : 1;
    check_job_fits_device(job, world_size, rank, gpu, compute_stream, sharers, (world_size + nodes - 1) / nodes);
  } catch (...) {  // a CUDA error too: every rank must hear of it
    error = std::current_exception();
  }
  plane.agree(error, {"the device memory check"});
}

}  // namespace thetad::daemon
