// Checkpoints: a directory per step, `step-00000040/` with manifest.json (daemon/checkpoint_format/manifest.hpp:
// format 6, a checksum per file and of itself) and the groups' values in files (`shard-00007.pt`, each a dict of
// tensors that Python's torch.load reads, with the groups it holds; at most kShardMaxGroups
// groups or kFileMaxBytes each, Θ in files of its own). Incremental: a checkpoint writes Θ (if it
// trained) and the groups whose step count changed since the newest complete checkpoint (this
// run's last, or the one resumed from); the files holding the other groups are that checkpoint's,
// hard-linked into the new directory (copied where links fail) once their bytes are verified
// against their checksums, so every directory is complete and verifiable on its own, a file
// damaged on disk never spreads into the next checkpoint, and `keep` may remove any of them
// (checkpoint_plan.hpp decides; a mostly stale file is rewritten). Written under a temporary name, the new files shared
// round-robin among the ranks, each synced to disk, the shared ones linked and the directory
// renamed by rank 0 (then the rename synced) once all have finished, so a directory named step-*
// is always complete, also after a crash of the machine. Keep-N pruning runs after that and
// never removes the new checkpoint. A group at its initial values (never held:
// offload.host_groups: scheduled) costs no bytes, and Θ that model.init_from gave and that never
// trained is not stored (the manifest fingerprints every source of such groups: the seed,
// model.init_from, lora.init_from's directories; resume checks them, init_sources.hpp). Resume
// leaves such groups as the fresh model has them. Formats 1 to 5 are still read.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "config/job.hpp"
#include "daemon/checkpoint_format/manifest.hpp"
#include "daemon/models/param_groups.hpp"
#include "daemon/state/checkpoint_plan.hpp"

namespace thetad::daemon {

struct CheckpointInfo {
  std::string path;
  int64_t step = 0;  // completed steps
};

// Newest complete checkpoint under dir, if any.
std::optional<CheckpointInfo> find_latest_checkpoint(const std::string& dir);
// The directory of the checkpoint after `step` completed steps.
std::string checkpoint_path(const std::string& dir, int64_t step);

// checkpoint.dir taken for one run (rank 0, before step 0): created, proven writable (a probe
// file written, synced and removed) and locked (flock on dir/.lock, held for the object's
// lifetime, released by the kernel if the process dies), so that a read-only, full or misnamed
// directory is found before any training and a second job on the same directory is refused,
// naming the holder. ConfigError naming the directory otherwise.
class CheckpointDirLock {
 public:
  CheckpointDirLock(const std::string& dir, const std::string& job_name);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  int fd_ = -1;
};

// A fresh start (--no-resume) in a directory holding checkpoints: moves them into
// dir/previous-<UTC time>/ so that a later resume cannot pick another run's newer step, and
// keep-N pruning never touches them. Returns that directory ("" when nothing was moved).
std::string set_aside_checkpoints(const std::string& dir);

// Writes this rank's share of a checkpoint. `barrier` is a collective barrier across ranks;
// `all_ok` an agreement that every rank succeeded. Returns the final directory.
// (checkpoint_write.cpp; checkpoint_dir.cpp holds the directory logic, checkpoint_read.cpp the reader.)
struct CheckpointWriter {
  std::string dir;
  int64_t step = 0;
  int rank = 0, world = 1;
  std::string job_name, job_hash;
  int64_t keep = 3;
  std::vector<int64_t> group_bytes;  // per group: bytes of its parameters and moments
  // What is written, what shared (checkpoint_plan.hpp); publish_files (rank 0) fills in the
  // written files' checksums, which the next checkpoint's manifest takes for the files it shares.
  std::shared_ptr<CheckpointPlan> plan;
  ManifestLayout layout;             // the parameters' layout (checkpoint_layout), in the manifest
  InitSources init;                  // the sources of the groups not stored (rank 0), in the manifest
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();  // for the log
  int threads = 1;  // that write (and checksum) each file, of the file pool: cpu_share (common/thread_pool.hpp)
  std::function<void()> barrier;
  std::function<bool(bool)> all_ok;
  std::function<std::string(const std::string&)> broadcast;  // rank 0's text to every rank
};
std::string write_checkpoint(const CheckpointWriter& w, const std::function<GroupState(int group)>& group_state);

// The phases of write_checkpoint, for a checkpoint written in the background (RunState): on the
// trainer thread begin_checkpoint (collective), snapshot_share, agree_checkpoint (collective);
// on any thread write_share (files only, no collective); back on the trainer thread
// publish_checkpoint (collective). A phase records its rank's failure in WriteStatus; the
// agreements make every rank throw the same Error (the temporary directory removed).
struct WriteStatus {
  bool ok = true;
  std::string error;
  std::vector<std::string> damaged;  // SharedFileDamaged's files (rank 0's publish)
};
// `e` as the phase's failure (SharedFileDamaged's files kept).
void record_failure(WriteStatus& st, const std::exception& e);

// A checkpoint not published because files it was to share from the newest complete checkpoint
// no longer match their checksums (damaged on disk since they were written): every rank throws
// it alike (agree_checkpoint). RunState then writes those files' groups anew instead of sharing
// them (CheckpointPlan::damaged), so that the damage never spreads into newer checkpoints.
class SharedFileDamaged : public Error {
 public:
  SharedFileDamaged(const std::string& what, std::vector<std::string> files_) : Error(what), files(std::move(files_)) {}
  std::vector<std::string> files;  // their names in the newest complete checkpoint
};
// A std::allocator that leaves resized elements uninitialised: the room a staged tensor takes
// in a shard's host vectors is filled by the writer thread, and zeroing it first on the trainer
// thread would cost a host write of the whole snapshot (~1 s for 8 GB), the stall staging removes.
template <class T>
struct UninitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitAllocator<U>;
  };
  UninitAllocator() = default;
  template <class U>
  UninitAllocator(const UninitAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
};
using HostFloats = std::vector<float, UninitAllocator<float>>;

// One shard's values as written (checkpoint.hpp's format 3), copied out of training state.
// Device tensors are staged: cloned on their device at the snapshot (a device-to-device copy,
// the trainer's whole stall), their room in the host vectors left unfilled until the writer
// threads copy them in block by block as they write the shard's file (fill_staged) and drop the
// clones once it is written, shard by shard.
struct ShardValues {
  size_t index = 0;  // in the plan's manifest.files
  std::string file;
  HostFloats param, exp_avg, exp_avg_sq;
  std::vector<int64_t> groups, offsets, steps;
  struct Staged {
    int vec = 0;    // 0 param, 1 exp_avg, 2 exp_avg_sq
    size_t at = 0;  // where its values go in that vector
    at::Tensor values;  // float32, contiguous, on the device (finished: see snapshot_share)
    int64_t pinned_at = -1;  // where its values are in `pinned` (GPUs), or -1
  };
  std::vector<Staged> staged;
  // GPUs: the staged values go on to pinned host memory at once (one copy per clone, on a copy
  // stream after the clones), so that the writer threads memcpy them with no driver call each
  // (a pageable copy per file block, from 16 threads, slowed the trainer's kernel launches).
  at::Tensor pinned;                   // kept from one checkpoint to the next; grows only
  std::shared_ptr<void> pinned_ready;  // those copies' completion (an event)
};
struct FiniteChecks;  // checkpoint_snapshot.hpp
// A rank's shards: a second host copy of what the rank writes (12 bytes per parameter of its
// shards). Reused from one checkpoint to the next: the vectors keep their capacity.
struct CheckpointShare {
  std::vector<ShardValues> shards;
  int64_t staged_bytes = 0, host_bytes = 0;  // of the last snapshot: cloned on a device / copied on the host
  // The staged parameters' finiteness, on its way to the host: read by write_share before the
  // first file, so that the trainer never waits for the device at a checkpoint.
  std::shared_ptr<FiniteChecks> finite;
};
void begin_checkpoint(const CheckpointWriter& w, WriteStatus& st);
// Copies this rank's shards (device tensors staged on their device, see ShardValues); Error (in
// st) for non-finite host parameters. The staged ones are checked by write_share (Error in its
// st: the write's agreement fails on every rank).
void snapshot_share(const CheckpointWriter& w, const std::function<GroupState(int group)>& group_state,
                    CheckpointShare& share, WriteStatus& st);
// `cancel` set: stops before the next file (a run that fails elsewhere abandons the write).
// The staged tensors' values are copied to the host here, by the threads writing their shard.
void write_share(const CheckpointWriter& w, CheckpointShare& share, WriteStatus& st,
                 const std::atomic<bool>* cancel);
void agree_checkpoint(const CheckpointWriter& w, const WriteStatus& st, const char* elsewhere);
std::string publish_checkpoint(const CheckpointWriter& w, WriteStatus st);
// Rank 0's part of publish_checkpoint, between its two agreements (manifest, rename, syncs,
// keep-N pruning); throws. Any thread: the decision to publish was agreed before.
void publish_files(const CheckpointWriter& w);

// Reads a checkpoint: its manifest parsed and checked once (format, step, groups, the model's
// hash; `num_groups` < 0: any count), then each file checked against its checksum before it is
// unpickled (a shard once for all its groups: load_group is fastest in group order) (every rank loads every group: groups are replicated, so a checkpoint resumes on
// any world size). Every problem is a ConfigError naming the file and, where there is one, the key.
class CheckpointReader {
 public:
  // `layout`: this job's (checkpoint_layout); a checkpoint of another layout is refused naming
  // the key or the first parameter that differs (layout.hpp), before its model hash is compared.
  CheckpointReader(const CheckpointInfo& ckpt, int num_groups, const std::string& expected_job_hash,
                   const ManifestLayout& layout = {});
  // Group g's state: by name (formats 1 and 2), or (format 3) with no names and one flat tensor
  // each of parameters and moments, in the group's flat layout (ParamGroups::offset).
  GroupState load_group(int group) const;
  // The groups in the order that reads each file once (format 4: by file; else 0, 1, ...).
  std::vector<int> load_order() const;
  const Manifest& manifest() const { return manifest_; }

 private:
  GroupState load_shard_group(int group) const;
  GroupState load_linked_group(int group) const;
  void read_shard(const c10::impl::GenericDict& dict, const std::string& file, bool with_groups) const;
  GroupState slice(GroupState st, size_t i, const std::string& file) const;
  GroupState load_group_file(int group) const;
  c10::impl::GenericDict load_file(const std::string& name, bool has_checksum, uint64_t checksum) const;
  at::Tensor tensor(const c10::impl::GenericDict& dict, const std::string& key, const std::string& file) const;
  ConfigError damaged(const std::string& name, const std::string& what) const;
  void check_state(const std::string& file, const GroupState& st) const;
  CheckpointInfo ckpt_;
  Manifest manifest_;
  struct Shard {  // the shard read last (formats 3 and 4), checked
    int64_t index = -1;
    at::Tensor param, exp_avg, exp_avg_sq;
    std::vector<int64_t> groups, offsets, steps;  // groups: format 4
  };
  mutable Shard shard_;
};

// A loaded group in the model's terms: its parameters' names, shapes and order as `groups` has
// them. Tensors by name are checked by name and shape (formats 1 and 2); a shard's flat values
// (format 3) are cut at the group's layout, their count checked. ConfigError naming `where`.
// The parameters' layout as a manifest records it: the job's layout keys, every group's names
// and shapes (ParamGroups' order).
ManifestLayout checkpoint_layout(const config::Job& job, const ParamGroups& groups);

GroupState in_model_layout(const GroupState& loaded, const ParamGroups& groups, int g, const std::string& where);

}  // namespace thetad::daemon
