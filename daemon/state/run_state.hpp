// The run's state on disk and across ranks: where a checkpoint is agreed and written (every
// rank writes its share, all agree that all succeeded before rank 0 publishes), where a run
// resumes (rank 0 picks the step, every rank loads it), and the final parameter hash. It reads
// and restores each group through its home (Homes), never asking where that is.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "comm/bootstrap.hpp"
#include "comm/control_plane.hpp"
#include "config/job.hpp"
#include "daemon/homes/homes.hpp"
#include "daemon/models/param_groups.hpp"
#include "daemon/hf/peft_adapters.hpp"  // export.adapters_dir
#include "daemon/checkpoint_format/init_sources.hpp"
#include "daemon/state/async_checkpoint.hpp"
#include "daemon/state/checkpoint.hpp"

namespace thetad::daemon {

class RunState {
 public:
  RunState(const config::Job& job, const comm::WorldInfo& world, comm::ControlPlane& plane, ParamGroups& groups,
           Homes& homes);

  // A fresh start (`resume` false) sets earlier checkpoints aside; a resume loads the newest
  // checkpoint rank 0 sees, so that every rank starts at the same step whatever its view of a
  // shared directory. Sets the groups' step counts; returns the first step to run.
  int64_t resume(bool resume);
  ~RunState();
  // Writes the checkpoint after `completed` steps (nothing without checkpoint.dir). Refuses
  // (Error, exit 1, on every rank) parameters that are not finite (write_checkpoint): the newest
  // checkpoint on disk then stays the last finite one. With checkpoint.async (and not `last`:
  // the end of the run or a stop), it returns once the rank's share is copied and every rank
  // agreed on the copy; a background thread writes the files and poll_checkpoint publishes.
  // A checkpoint still in flight is published first (at most one in flight).
  void checkpoint(int64_t completed, bool last);
  // Whether checkpoint(completed, last) returns with the write still in the background (it never
  // waits for the step's device work then).
  bool checkpoints_in_background(bool last) const { return job_.checkpoint.async && !last; }
  // At a step boundary, on every rank: when a checkpoint is in flight, one control-plane
  // allreduce asks whether every rank's writer is done; if so, the ranks agree on the outcome and
  // rank 0 publishes (Error on every rank if a write failed: exit 1, as a failed synchronous
  // checkpoint).
  void poll_checkpoint(int64_t step);
  // Waits for the in-flight checkpoint (up to comm.timeout_s), agrees and publishes it.
  void finish_checkpoint(int64_t step);
  // With checkpoint.async, after the run's first step: a snapshot of the device-resident groups,
  // written nowhere, so that the first checkpoint's stall is a later one's. Its clones' device
  // memory stays in the caching allocator for the checkpoints to reuse (cudaMalloc of GBs and
  // the kernels' first loads were the first async checkpoint's stall: 49 ms against 4 ms on
  // 2 x H200), and the device cache, sized after the first step, leaves it to them. Host
  // groups are not read: no one-time cost there, and reading a cached one would flush it.
  void warm_up_checkpoints(int64_t completed);
  // The first parameter of groups first, first + stride, ... that holds a NaN or an Inf, as
  // "parameter 'name' of group g", or "" where all are finite. Read where each group lives; a
  // pass over the parameters, so only after a non-finite loss (to say what is non-finite).
  std::string first_nonfinite_param(int first, int stride);
  // FNV-1a over every parameter's bytes in registration order, read where each lives. After the
  // run's final checkpoint, the hash rank 0 computed while writing it.
  uint64_t params_hash();
  // export.adapters_dir: at the run's end (`last`) and, with export.at_checkpoints, at every
  // checkpoint step, each rank stages its share of the adapters trained since the last export
  // (`again`: every trained one, for a run found complete at start) as PEFT directories, checked
  // finite, and at the run's end its share of export.merged_dir's models; once every rank staged
  // its share all are put in place (Error, exit 1, on every rank and nothing published, if any
  // failed).
  void export_adapters(int64_t completed, bool last, bool again = false);
  // export.best: eval_loss: the state an export writes for group g where `pick` gives one (the
  // adapter kept at its best eval loss), else the group's own.
  void export_from(std::function<std::optional<GroupState>(int g)> pick) { export_pick_ = std::move(pick); }

 private:
  GroupState state(int g);
  CheckpointWriter writer(int64_t completed);
  // The checkpoint after `completed` steps, published before it returns unless it goes to the
  // background (see checkpoint()). False where it was not published because a file it was to
  // share is damaged (SharedFileDamaged): the next one writes that file's groups anew.
  bool write_or_start(int64_t completed, bool last);
  void advance_checkpoint(int64_t step, bool wait);
  // A checkpoint not published for damaged shared files: they are never shared again.
  void drop_damaged(const SharedFileDamaged& e);
  // The job's sources of the values unstored groups get (init_sources.hpp), and rank 0's record
  // of them for a checkpoint whose plan leaves groups unstored (fingerprints taken at start-up).
  InitSourcesNow init_now() const;
  InitSources init_record(const CheckpointPlan& plan) const;
  int64_t damaged_drops_ = 0;                 // checkpoints not published for damaged shared files
  InitFromPrint model_print_;                 // rank 0: model.init_from's at start-up
  std::vector<InitFromPrint> lora_prints_;    // rank 0: each task's lora.init_from directory at start-up
  std::unique_ptr<CheckpointInFlight> inflight_;  // the asynchronous checkpoint being written
  std::unique_ptr<CheckpointShare> spare_;         // the last one's snapshot buffers, reused
  // For a background write's thread count (background_checkpoint_threads): when and at which
  // step the last checkpoint (or the run's first step) was, and what one writer thread wrote per
  // second in the last background write (1 GB/s until one was measured: one thread on the H100
  // host wrote the LoRA job's 1.2 GB in 1.1-1.5 s).
  std::chrono::steady_clock::time_point cadence_from_;
  int64_t cadence_step_ = -1;
  double write_bytes_per_thread_s_ = 1e9;
  std::unique_ptr<CheckpointDirLock> lock_;  // rank 0: checkpoint.dir is this run's
  // The newest complete checkpoint's plan (this run's or the one resumed from): the next one
  // shares its files of unchanged groups.
  std::shared_ptr<const CheckpointPlan> last_;
  std::optional<uint64_t> final_hash_;  // rank 0: computed while the final checkpoint was written
  // The final checkpoint overlaps the hash where each rank's snapshot copies at most this much.
  static constexpr int64_t kOverlapMaxBytes = int64_t{2} << 30;
  const config::Job& job_;
  const comm::WorldInfo world_;
  comm::ControlPlane& plane_;
  ParamGroups& groups_;
  Homes& homes_;
  std::unique_ptr<AdapterExport> export_;  // export.adapters_dir, export.merged_dir (null: none)
  std::function<std::optional<GroupState>(int)> export_pick_;  // export.best
};

}  // namespace thetad::daemon
