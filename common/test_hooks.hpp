// The test aids: THETAD_TEST_* environment variables that make a run misbehave on purpose (a slow
// or full disk, a rank that stalls) so that tests reach the failure paths. They are read here and
// nowhere else, one function per variable, each documented below and in docs/configuration.md
// ("Test aids"); unset (or empty), each is off. Production never sets them.
//
//   if (test_hooks::checkpoint_enospc_rank() == rank) fail_as_full_disk();
//   test_hooks::stall_at(test_hooks::StallPoint::cache_agreement, rank);  // sleeps only when asked
#pragma once

#include <cstdint>
#include <string>

namespace thetad::test_hooks {

// THETAD_TEST_CHECKPOINT_WRITE_DELAY_MS=N: every checkpoint shard file waits N ms before it is
// written (a slow disk, so that a test can stop a run while a write is in flight). 0 when unset.
int64_t checkpoint_write_delay_ms();
// THETAD_TEST_CHECKPOINT_ENOSPC_RANK=R: rank R's checkpoint shard writes fail as a full disk
// does (ENOSPC). -1 when unset.
int checkpoint_enospc_rank();
// THETAD_TEST_CHECKPOINT_STAGE_HOST=1: a checkpoint snapshot stages host tensors too (clones
// them), so that the CPU build runs the staged path. false when unset or 0.
bool checkpoint_stage_host();

// THETAD_TEST_CHECKPOINT_BACKGROUND_THREADS=N (N > 0): a checkpoint written in the background
// uses N writer threads instead of half the rank's (bench/checkpoint/every_steps.sh compares
// them). 0 when unset.
int checkpoint_background_threads();

// THETAD_TEST_SLOT_PASS=1: on the CPU, a pass that a GPU would replay from a CUDA graph
// (train.cuda_graphs) runs through the same slots and gradient delivery without one, so that
// CPU tests compare that path with the plain one. false when unset or 0.
bool slot_pass_without_graph();

// THETAD_TEST_DEVICE_MEMORY=<free MiB>/<total MiB>: the device memory check before the model is
// built (daemon/plan/device_memory_estimate) sees this much free and total device memory instead
// of the GPU's, and runs on CPU ranks too, so that CPU CI reaches the refusal. false (and nothing
// set) when unset or malformed.
bool device_memory(int64_t* free_bytes, int64_t* total_bytes);

// THETAD_TEST_TRUNCATE_MAPPED=NAME: a safetensors file named NAME (its last path component) is
// cut to its header by the reader itself once mapped and its header read, before any tensor is
// copied out of the map: another process shortening a model file under a running job. false
// for every other file, and when unset.
bool truncate_mapped(const std::string& path);

// Where a rank can be made to stall before an agreement of every rank.
enum class StallPoint {
  nccl_id_exchange,  // "nccl_id_exchange": before the NCCL bootstrap's unique-id exchange
  cache_agreement,   // "cache_agreement": before the parameter store's device-cache agreement
};
// THETAD_TEST_STALL=<point>@<rank>:<seconds>, e.g. cache_agreement@1:5: rank <rank> sleeps that
// long at that point (the others time out there: a peer that never arrives). Returns at once
// for any other point or rank, or when unset; a malformed value is ignored.
void stall_at(StallPoint point, int rank);

}  // namespace thetad::test_hooks
