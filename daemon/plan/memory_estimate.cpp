// The host memory a job needs, checked before allocating (see memory_estimate.hpp).
#include "daemon/plan/memory_estimate.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>

#include "common/errors.hpp"
#include "daemon/plan/placement.hpp"
#include "offload/host_arena.hpp"
#include "offload/meminfo.hpp"

namespace thetad::daemon {

std::string format_bytes(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

std::string format_count(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 1e6 ? "%.0f" : "%.3g", v);
  return buf;
}

namespace {

const auto count = format_count;

}  // namespace

HostMemoryNeed host_memory_need(const config::Job& job, const config::ParamCounts& c, int local_ranks, bool gpu) {
  HostMemoryNeed need;
  need.local_ranks = local_ranks;
  if (!c.known) return need;
  need.known = true;
  const Placement place = Placement::of(job, 1);
  const config::OffloadConfig& o = job.offload;
  const bool adam = job.optimizer.kind != config::OptimizerKind::Sgd;
  // A trained resident parameter: its value, its gradient (the engine's bucket) and, with Adam,
  // m and v (made at its group's first update; every group is updated sooner or later). A frozen
  // Θ (model.train_shared: false) holds its values only.
  const double trained = adam ? 16 : 8;
  const bool theta_streamed = place.shared == HomeKind::streamed_trunk;
  const bool task_store = place.tasks == HomeKind::host_store;
  // A frozen base in nf4 (model.base_quant): 4.25 bits a value where the model is, and, read from a
  // file, its full-precision values in host memory besides, wherever the model is (drawn: none).
  const bool quantized = job.model.base_quant != config::BaseQuant::None;
  const double theta_bytes = theta_streamed || place.streamed_base ? 0
                             : quantized    ? c.shared * kNf4BytesPerValue
                                            : c.shared * (job.model.train_shared ? trained : 4);
  const double theta_copy = quantized && !place.drawn_quantized_base ? c.shared * (place.frozen_base_bf16 ? 2 : 4) : 0;
  const double tasks_bytes = task_store ? 0 : c.tasks_total * trained;
  // The host stores' arenas, one per node, as HostArena sizes them (values, Adam m and v, the
  // gradient's landing area, a bf16 copy with offload.h2d_dtype: bf16; aligned, page-rounded).
  // offload.host_groups: scheduled holds the groups the schedule uses: at least one. Θ's store
  // (offload.shared: stream) is counted as one group.
  const auto arena = [](int64_t groups, double per_group, bool bf16) {
    const std::vector<offload::ArenaEntry> entries(static_cast<size_t>(groups),
                                                   offload::ArenaEntry{1, static_cast<size_t>(per_group)});
    return static_cast<double>(offload::HostArena::required_bytes(entries, bf16));
  };
  const bool bf16 = o.h2d_dtype == config::H2dDtype::Bf16;
  const int64_t tasks = o.host_groups == config::HostGroups::All ? job.model.tasks : 1;
  const double task_params = static_cast<double>(tasks) * std::floor(c.tasks_total / double(job.model.tasks));
  const double arena_tasks = task_store ? arena(tasks, task_params / double(tasks), bf16) : 0;
  const double arena_theta = theta_streamed ? arena(1, c.shared, false) : 0;
  need.per_rank_bytes = static_cast<int64_t>((gpu ? 0 : theta_bytes + tasks_bytes) + theta_copy);
  // A transformer's streamed or sharded frozen base (homes/streamed_base.hpp): its values once a
  // node (in nf4: its codes and absmax).
  const double streamed_base =
      !place.streamed_base ? 0 : c.shared * (quantized ? kNf4BytesPerValue : place.frozen_base_bf16 ? 2 : 4);
  need.node_bytes = static_cast<int64_t>(arena_tasks + arena_theta + streamed_base);

  std::ostringstream os;
  const char* moments = adam ? "values, gradients, Adam m and v" : "values and gradients";
  if (need.per_rank_bytes > 0)
    os << local_ranks << " rank(s) x " << format_bytes(double(need.per_rank_bytes)) << " (" << moments << ": "
       << count(theta_streamed ? 0 : c.shared) << " shared parameters"
       << (task_store ? "" : " + " + count(c.tasks_total) + " of the tasks, model.tasks = " +
                               std::to_string(job.model.tasks) + " x " + count(c.per_task) + " each")
       << ")";
  if (theta_copy > 0) os << " + the quantized base's own values " << format_bytes(theta_copy) << " (model.base_quant)";
  if (arena_tasks > 0)
    os << (os.tellp() > 0 ? " + " : "") << "the task groups' host arena " << format_bytes(arena_tasks) << " ("
       << count(task_params) << " parameters of " << tasks << " group(s): values, Adam m and v, gradients"
       << (bf16 ? ", bf16 copies" : "") << ")";
  if (arena_theta > 0)
    os << (os.tellp() > 0 ? " + " : "") << "the streamed trunk's host store " << format_bytes(arena_theta);
  if (streamed_base > 0)
    os << (os.tellp() > 0 ? " + " : "") << "the streamed base's host copy " << format_bytes(streamed_base)
       << " (offload.shared: stream)";
  need.parts = os.str();
  // The key behind the largest term: the tasks' parameters or the shared ones.
  const bool tasks_drive = tasks_bytes + arena_tasks >= theta_bytes + arena_theta + streamed_base;
  if (tasks_drive)
    need.key = job.model.kind == config::ModelKind::ExtremeClassifier ? "model.classes" : "model.tasks";
  else
    need.key = job.model.kind == config::ModelKind::Transformer ? "model.d_model" : "model.hidden";
  return need;
}

int64_t host_memory_available() {
  const uint64_t bytes = offload::mem_available_bytes();
  return bytes > 0 ? static_cast<int64_t>(bytes) : -1;
}

void check_host_memory(const config::Job& job, const HostMemoryNeed& need, int64_t available, const std::string& where) {
  if (!need.known || available < 0 || need.total() <= available) return;
  std::string hint = "lower " + need.key;
  if (need.per_rank_bytes > need.node_bytes && need.local_ranks > 1) hint += ", run fewer ranks per node";
  if (Placement::of(job, 1).tasks == HomeKind::resident && need.per_rank_bytes > 0)
    hint += ", or keep the task groups in one host arena per node (offload.enabled)";
  throw ConfigError(job.source + ": " + need.key + ": the job needs at least " + format_bytes(double(need.total())) +
                    " of host memory on " + where + ", which has " + format_bytes(double(available)) +
                    " available (MemAvailable in /proc/meminfo): " + need.parts + "; " + hint +
                    " (activations and data come on top)");
}

}  // namespace thetad::daemon
