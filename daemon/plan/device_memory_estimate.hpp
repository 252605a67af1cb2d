// The device memory one rank needs at least, from the model and placement keys, before the model
// is built: what set-up allocates and the first step surely adds (not what is sized later or as far
// as the device allows); a job over the device's free memory is exit 2 naming the key and sizes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/control_plane.hpp"
#include "config/job.hpp"
#include "config/loader.hpp"

namespace thetad::daemon {

struct DeviceMemoryTerm {
  std::string what;  // in words, with its size's factors
  int64_t bytes = 0;
  std::string key;   // the job key that drives it
};

struct DeviceMemoryNeed {
  bool known = false;                   // false: a model validation cannot count (torchscript)
  std::vector<DeviceMemoryTerm> terms;  // each > 0 bytes
  std::string not_counted;              // what comes on top, in words
  int64_t total() const;
  // The key whose terms add up to the most bytes ("" without terms).
  std::string key() const;
  // "Θ's values 1.00 GiB (...) + ..." in the terms' order.
  std::string parts() const;
};

// The task groups of the first optimizer step: those the rank's forward uses in its micro-steps
// (each is bound to a gradient pool buffer), those it trains in one micro-step (their bf16 copies
// live from that forward to its backward), and those any rank trains (every rank creates the
// Adam moments of every resident group some rank trained).
struct FirstStepGroups {
  int64_t rank_used = 1;
  int64_t rank_trained_micro = 1;
  int64_t any_trained = 1;
};
FirstStepGroups first_step_groups(const config::Job& job, int world_size, int rank);

// `node_ranks`: the ranks of a node, over which model.base_shard: node shards the base (1: counted
// for one rank, as validate does).
DeviceMemoryNeed device_memory_need(const config::Job& job, const config::ParamCounts& counts,
                                    const FirstStepGroups& first, int node_ranks = 1);

// Throws ConfigError (exit 2) naming the job file, need.key(), the sizes and the device's free
// and total memory where need.total() > free_bytes. `where` names the device ("cuda:0 (rank 1)").
void check_device_memory(const config::Job& job, const DeviceMemoryNeed& need, int64_t free_bytes,
                         int64_t total_bytes, const std::string& where);

// The device memory the check compares with: THETAD_TEST_DEVICE_MEMORY's (any rank, "the test
// aid's device" in `where`), else GPU `gpu` (>= 0) through offload's CUDA device, its free memory
// divided among the `sharers` ranks of the host that use it. false: nothing to compare with (a
// CPU rank, or the GPU cannot tell).
bool device_memory_for_check(int gpu, void* compute_stream, int sharers, int64_t* free_bytes, int64_t* total_bytes,
                             std::string* where);

// thetad run, once the rank's device is chosen and before the model is built: the estimate
// (its parts logged on rank 0), checked against the device's memory where there is one (see
// device_memory_for_check). A rank that cannot fit makes every rank of `plane` throw, as
// check_device_memory does (ControlPlane::agree), so none waits for it in a later collective.
void check_job_fits_device(const config::Job& job, comm::ControlPlane& plane, int world_size, int rank, int gpu,
                           void* compute_stream, int sharers);

}  // namespace thetad::daemon
