// The snapshot of a checkpoint: a rank's shards copied out of training state (checkpoint.hpp's
// ShardValues), device tensors staged on their device in a few flat clones, and the finiteness
// check of what is written. The writer side, fill_staged, copies the clones to the host block by
// block as the shard's file is written (checkpoint_write.cpp).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "daemon/state/checkpoint.hpp"

namespace thetad::daemon {

// The finiteness of staged parameters, computed on their device and read once per snapshot,
// and what staging may still take.
struct FiniteChecks {
  struct Run {  // a flat clone of parameters and where each one lies in it
    at::Tensor values;
    std::vector<std::tuple<std::string, int64_t, int64_t, int64_t>> params;  // name, group, offset, count
  };
  std::vector<at::Tensor> flags;  // bool scalars, one per staged run of parameters
  std::vector<Run> runs;          // the same runs
  std::string host_error;  // the first non-finite parameter copied on the host, said by check_finite
  at::Tensor host_flags;          // the flags on their way to the host (launch_finite_check)
  std::shared_ptr<void> flags_ready;  // GPUs: that copy's completion (an event)
  bool staging = true;  // false once the device's budget is spent or a clone failed: host copies from then on
  int64_t stage_left = -1;  // bytes staging may still take (-1: not asked yet; one device per rank)
  int64_t staged_bytes = 0, host_bytes = 0;
};

// Copies shard k's groups into `out` (its vectors keep their capacity from the last time); see
// checkpoint_snapshot.cpp. Non-finite parameters are recorded in `checks` for check_finite.
void snapshot_shard(const CheckpointWriter& w, size_t k, const std::function<GroupState(int)>& group_state,
                    ShardValues& out, FiniteChecks& checks);
// The staged runs' flags sent to the host after the clones, on the trainer's stream: no wait.
void launch_finite_check(FiniteChecks& c);
// One read of every staged run's flag (launched here if not yet), on any thread: a wait for the
// clones on the device. Error naming the first non-finite parameter (host copies first).
void check_finite(const CheckpointWriter& w, FiniteChecks& c);
// The writer's side of staging: the clones' values of bytes [from, from + n) of vector `vec`
// (0 param, 1 exp_avg, 2 exp_avg_sq) copied into their room in the host vectors.
void fill_staged(ShardValues& v, int vec, uint64_t from, uint64_t n);

}  // namespace thetad::daemon
