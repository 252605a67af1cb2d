// What a job needs of this node's host memory before anything is allocated, from the parameter
// counts validation finds in the model keys (config::param_counts): the ranks' parameters,
// gradients and optimizer state where they live on the host, and the host stores' arenas. A
// lower bound (activations, data and LibTorch's own memory come on top), so that only a job that
// cannot fit is refused: exit 2 naming the sizes and the key that drives them, instead of an
// allocation failure deep inside model building.
#pragma once

#include <cstdint>
#include <string>

#include "config/job.hpp"
#include "config/loader.hpp"

namespace thetad::daemon {

// The bytes a value of a frozen base in nf4 (model.base_quant) takes: 4 bits of code and a bf16
// absmax per 64 values (daemon/ops/nf4.hpp holds the format; daemon/models checks the two agree).
constexpr double kNf4BytesPerValue = 0.5 + 2.0 / 64;

struct HostMemoryNeed {
  bool known = false;           // false: a model validation cannot count (torchscript)
  int64_t per_rank_bytes = 0;   // each rank's own parameters, gradients, optimizer state (CPU runs)
  int64_t node_bytes = 0;       // the host stores' arenas, one per node
  int local_ranks = 1;
  int64_t total() const { return per_rank_bytes * local_ranks + node_bytes; }
  std::string parts;            // the terms in words, for the message
  std::string key;              // the key that drives the largest term
};

// `local_ranks`: the ranks of this node; `gpu`: the ranks compute on GPUs (their resident groups
// then live in device memory, not counted here).
HostMemoryNeed host_memory_need(const config::Job& job, const config::ParamCounts& counts, int local_ranks, bool gpu);

// MemAvailable of /proc/meminfo in bytes, or -1 where it cannot be read.
int64_t host_memory_available();

// Throws ConfigError (exit 2) naming the job file, the key, the sizes and `available` where the
// need exceeds it (available < 0: unknown, nothing checked). `where` says whose memory ("this
// node" in thetad run, "this host" in validate).
void check_host_memory(const config::Job& job, const HostMemoryNeed& need, int64_t available, const std::string& where);

// "1.50 GiB", "512 MiB", "12 KiB", "10 B".
std::string format_bytes(double bytes);
// A count of parameters: "40010", "1.05e+06" (three digits from a million on).
std::string format_count(double v);

}  // namespace thetad::daemon
