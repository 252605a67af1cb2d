// Checkpoints, resume and the final hash (see run_state.hpp).
#include "daemon/state/run_state.hpp"

#include <ATen/Parallel.h>

#include <chrono>
#include <iomanip>
#include <map>

#include "comm/bucket_plan.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/stopwatch.hpp"
#include "common/test_hooks.hpp"
#include "config/loader.hpp"
#include "daemon/checkpoint_format/file_checksum.hpp"
#include "daemon/plan/job_options.hpp"
#include "daemon/plan/placement.hpp"
#include "daemon/models/param_builder.hpp"
#include "common/thread_pool.hpp"

namespace thetad::daemon {
namespace {

using Clock = SteadyClock;

// FNV-1a (of 64-bit words) of a parameter's bytes: directly for up to 16 MiB, else over the
// hashes of its 16 MiB pieces, hashed in parallel on the process's pool, idle once training is
// done (rank 0 fingerprints 34 GB of parameters at T = 256: bytewise on one thread that took over
// a minute); `parallel` false where the caller already runs one such hash per thread.
uint64_t bytes_hash(const void* data, size_t bytes, uint64_t seed, bool parallel = true) {
  constexpr size_t kPiece = size_t{16} << 20;
  const size_t pieces = (bytes + kPiece - 1) / kPiece;
  if (pieces <= 1) return comm::fnv1a64_words(data, bytes, seed);
  std::vector<uint64_t> hs(pieces);
  const char* base = static_cast<const char*>(data);
  ThreadPool::instance().parallel_for(pieces, [&](size_t i) {
    const size_t off = i * kPiece;
    hs[i] = comm::fnv1a64_words(base + off, std::min(kPiece, bytes - off));
  }, parallel ? 0 : 1);
  return comm::fnv1a64(hs.data(), hs.size() * sizeof(uint64_t), seed);
}

// The hashes of the parameters of task groups the host arena does not hold (offload.host_groups:
// scheduled): their initial values drawn again, each parameter by one thread into a buffer of its
// own and hashed there, the whole run of such parameters from `p` on in parallel on the store's
// CPU threads, idle once training is done (each parameter has a generator of its own, so the
// values do not depend on who draws them). 10,000 LoRA adapters are 168 GB of values.
class InitialHashes {
 public:
  InitialHashes(const Homes& homes, const ParamGroups& groups) : homes_(homes), groups_(groups) {}

  bool drawn(int p) const {
    const int g = groups_[p].group;
    return homes_.of(g).initial(g);
  }

  // Fills per[p .. end) for the run of drawn parameters starting at p; returns end.
  int hash_run(int p, std::vector<uint64_t>& per) const {
    int end = p;
    while (end < static_cast<int>(groups_.size()) && drawn(end)) ++end;
    ThreadPool& pool = ThreadPool::instance();
    const size_t n = static_cast<size_t>(end - p), chunks = std::min(n, 4 * pool.threads());
    pool.parallel_for(chunks, [&](size_t c) {
      std::vector<float> buf;
      for (size_t k = c * n / chunks; k < (c + 1) * n / chunks; ++k) {
        const int q = p + static_cast<int>(k);
        buf.resize(static_cast<size_t>(groups_[q].tensor.numel()));
        homes_.of(groups_[q].group).initial_values(q, buf.data());
        per[static_cast<size_t>(q)] = bytes_hash(buf.data(), buf.size() * sizeof(float), comm::fnv1a64("", 0),
                                                 /*parallel=*/false);
      }
    });
    return end;
  }

 private:
  const Homes& homes_;
  const ParamGroups& groups_;
};

}  // namespace

RunState::RunState(const config::Job& job, const comm::WorldInfo& world, comm::ControlPlane& plane,
                   ParamGroups& groups, Homes& homes)
    : job_(job), world_(world), plane_(plane), groups_(groups), homes_(homes) {
  // export.adapters_dir's and export.merged_dir's directories are checked before any step (exit 2).
  if (job.export_.any()) export_ = std::make_unique<AdapterExport>(job, groups);
  // The sources of groups a checkpoint may leave unstored, fingerprinted as the model was built
  // from them (rank 0 writes the manifests): model.init_from, and where task groups may stay at
  // their initial values (offload.host_groups: scheduled), each task's lora.init_from directory.
  if (world.rank != 0 || job.checkpoint.dir.empty()) return;
  if (!job.model.init_from.empty()) model_print_ = fingerprint_path(job.model.init_from, "model.init_from");
  if (!job.lora.init_from.empty() && homes.placement().unheld_tasks)
    for (int64_t t = 0; t < job.model.tasks; ++t)
      lora_prints_.push_back(fingerprint_path(adapter_dir(job.lora.init_from, job, t), "lora.init_from"));
}

InitSourcesNow RunState::init_now() const {
  InitSourcesNow n;
  n.seed = detail::init_seed(job_);
  n.seed_key = job_.model.init_seed >= 0 ? "model.init_seed" : "seed";
  n.model_path = job_.model.init_from;
  n.lora_pattern = job_.lora.init_from;
  n.lora_dir = [this](int64_t t) { return adapter_dir(job_.lora.init_from, job_, t); };
  return n;
}

InitSources RunState::init_record(const CheckpointPlan& plan) const {
  InitSources s;
  s.has_seed = true;
  s.seed = detail::init_seed(job_);
  s.model = model_print_;
  if (job_.lora.init_from.empty()) return s;
  s.lora_pattern = job_.lora.init_from;
  for (int64_t t : initial_tasks(plan.manifest.runs)) {
    THETAD_CHECK(static_cast<size_t>(t) < lora_prints_.size(), InternalError, "task ", t,
                 " is initial without a lora.init_from fingerprint");
    s.lora.push_back({t, lora_prints_[static_cast<size_t>(t)]});
  }
  return s;
}

// PEFT adapter export (see run_state.hpp): each rank writes its share of the adapters updated
// since the last export; every rank agrees on the outcome.
void RunState::export_adapters(int64_t completed, bool last, bool again) {
  if (!export_ || !(last || job_.export_.at_checkpoints)) return;
  // Every rank stages its share (checked finite, under temporary names); only once all staged
  // theirs is any put in place: an export is whole or absent, never a part of the tasks.
  const auto agree = [&](const std::function<void()>& work, const char* what) {
    std::string error;
    try {
      work();
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (plane_.all_ok(error.empty(), {what, completed, -1})) return;
    export_->discard_staged();
    const std::string redo = last && !job_.checkpoint.dir.empty()
        ? " (the run's checkpoints are written: once the cause is fixed, run the job again and it exports its adapters)"
        : "";
    throw Error((error.empty() ? "export: another rank failed to write its share" : error) + redo);
  };
  const auto read = [this](int g) {
    std::optional<GroupState> kept = export_pick_ ? export_pick_(g) : std::nullopt;
    return kept ? std::move(*kept) : state(g);
  };
  agree([&] { export_->stage_changed(world_.rank, world_.size, homes_.group_steps(), read, again, last); },
        "allreduce of the adapter export status");
  agree([&] { export_->publish_staged(); }, "allreduce of the adapter export's publish status");
}

GroupState RunState::state(int g) {
  GroupState st = homes_.of(g).state(g);
  st.steps = homes_.group_steps()[static_cast<size_t>(g)];
  return st;
}

int64_t RunState::resume(bool resume) {
  if (job_.checkpoint.dir.empty()) return 0;
  const std::string dir = config::checkpoint_dir(job_);
  const int64_t step = plane_.run_on_root(0, {"choosing the checkpoint to resume from"}, [&]() -> int64_t {
    lock_ = std::make_unique<CheckpointDirLock>(dir, job_.name);
    if (!resume) {
      const std::string aside = set_aside_checkpoints(dir);
      if (!aside.empty()) {
        THETAD_LOG(warn, "ckpt") << "--no-resume: the checkpoints already in " << dir << " were moved to "
                                 << aside << " (a later resume would otherwise pick them up)";
      }
      return -1;
    }
    const auto found = find_latest_checkpoint(dir);
    return found ? found->step : -1;
  });
  if (step < 0) return 0;
  const CheckpointInfo ckpt{checkpoint_path(dir, step), step};
  const CheckpointReader reader(ckpt, groups_.num_groups(), model_hash(job_),
                                checkpoint_layout(job_, groups_));  // another model or layout: exit 2 first
  // A checkpoint past the job's end (steps lowered since): there is nothing to run, and
  // running on would be silent about it. (At exactly `steps` the job is complete: nothing to do.)
  if (step > job_.steps)
    throw ConfigError(ckpt.path + ": the newest checkpoint is of step " + std::to_string(step) + ", past steps: " +
                      std::to_string(job_.steps) + " of this job; nothing would run (raise steps above " +
                      std::to_string(step) + " to train on, or start anew with --no-resume)");
  // The groups the checkpoint does not store get the values they had: the same sources.
  const std::vector<std::string> notes = check_init_sources(reader.manifest(), init_now(), ckpt.path + "/manifest.json");
  if (world_.rank == 0) {
    if (reader.manifest().format == kManifestFormatV5) {
      THETAD_LOG(warn, "ckpt") << ckpt.path << "/manifest.json is of format 5 (an earlier release): it has no checksum of its "
                               << "own and no step count per group, so its map of groups to files is read as it is; the "
                               << "files are checked against their checksums, and the next checkpoint is of format 6";
    }
    for (const std::string& note : notes) THETAD_LOG(warn, "ckpt") << note;
  }
  for (int g : reader.load_order()) {
    const GroupState st = in_model_layout(reader.load_group(g), groups_, g, ckpt.path);
    homes_.group_steps()[static_cast<size_t>(g)] = st.steps;
    if (st.initial) continue;  // never updated: the fresh model and store hold its initial values
    homes_.of(g).restore(g, st);
  }
  // The next checkpoint shares this one's files of groups that did not change (formats 5 and 6:
  // the manifest carries its files' checksums over, of blocks; an older one is written whole once).
  if (has_block_checksums(reader.manifest().format))
    last_ = plan_of_read(reader.manifest(), ckpt.path, homes_.group_steps());
  THETAD_LOG(info, "ckpt") << "resumed from " << ckpt.path << " at step " << ckpt.step;
  return ckpt.step;
}

std::string RunState::first_nonfinite_param(int first, int stride) {
  torch::NoGradGuard no_grad;
  for (int g = first; g < groups_.num_groups(); g += stride) {
    GroupHome& home = homes_.of(g);
    if (home.initial(g)) continue;  // initial values: finite
    for (int p : groups_.members[static_cast<size_t>(g)])
      if (!homes_.finite(p)) return "parameter '" + groups_[p].name + "' of group " + std::to_string(g);
  }
  return "";
}

// An unpublished checkpoint still in flight (an error on its way out): its write is cancelled,
// its temporary directory never published.
RunState::~RunState() = default;

CheckpointWriter RunState::writer(int64_t completed) {
  CheckpointWriter w;
  w.dir = config::checkpoint_dir(job_);
  w.step = completed;
  w.rank = world_.rank;
  w.world = world_.size;
  w.job_name = job_.name;
  w.job_hash = model_hash(job_);
  w.keep = job_.checkpoint.keep;
  w.threads = static_cast<int>(cpu_share(world_.local_size));  // the node's cores shared among its ranks
  w.layout = checkpoint_layout(job_, groups_);
  const std::vector<int64_t>& steps = homes_.group_steps();
  std::vector<GroupSource> source;
  // No values written: the home does not hold them, or Θ is a drawn base held quantized
  // (model.base_quant) or streamed (offload.shared: stream), whose matrices the seed draws
  // again: a 32 B base is not widened to float32 for every checkpoint.
  const Placement& place = homes_.placement();
  const bool drawn_frozen = place.drawn_quantized_base || (place.streamed_base && job_.model.init_from.empty());
  for (int g = 0; g < groups_.num_groups(); ++g) {
    const bool initial = homes_.of(g).initial(g) || (g == 0 && drawn_frozen);
    w.group_bytes.push_back(initial ? 0 : groups_.numel(g) * 3 * int64_t{sizeof(float)});
    // Θ from model.init_from (all of it comes from the file) and never trained: the file holds it.
    const bool from_file = g == 0 && !job_.model.init_from.empty() && steps[0] == 0;
    source.push_back(initial ? GroupSource::initial : from_file ? GroupSource::init_from : GroupSource::values);
  }
  auto plan = std::make_shared<CheckpointPlan>(plan_checkpoint(last_.get(), w.group_bytes, steps, source));
  plan->dir = checkpoint_path(w.dir, completed);
  if (world_.rank == 0) w.init = init_record(*plan);
  w.plan = std::move(plan);
  w.barrier = [this, completed] { plane_.barrier({"checkpoint barrier", completed, -1}); };
  w.all_ok = [this, completed](bool ok) {
    return plane_.all_ok(ok, {"allreduce of the checkpoint status", completed, -1});
  };
  w.broadcast = [this, completed](const std::string& text) {
    return plane_.broadcast(text, 0, {"broadcast of the checkpoint's damaged files", completed, -1});
  };
  return w;
}

void RunState::checkpoint(int64_t completed, bool last) {
  // Files, the final hash and adapter exports (all after this call) never see a stale replica.
  if (last || !job_.checkpoint.dir.empty() || (export_ && job_.export_.at_checkpoints)) homes_.make_current();
  if (job_.checkpoint.dir.empty()) return;
  finish_checkpoint(completed);  // at most one in flight
  if (write_or_start(completed, last)) return;
  // Not published: a file it was to share is damaged (drop_damaged said which). Written again at
  // once with those files' groups written anew, so that a checkpoint the run waits for (the
  // run's last: exit 0 means it is published) is never skipped.
  if (!write_or_start(completed, last))
    throw Error("checkpoint at step " + std::to_string(completed) + ": files to share were found damaged twice; "
                "the disk under " + job_.checkpoint.dir + " corrupts files");
}

void RunState::drop_damaged(const SharedFileDamaged& e) {
  ++damaged_drops_;
  if (world_.rank == 0) {
    THETAD_LOG(warn, "ckpt") << e.what();
  }
  THETAD_CHECK(last_ != nullptr, InternalError, "damaged shared files without a checkpoint they come from");
  auto plan = std::make_shared<CheckpointPlan>(*last_);
  plan->damaged.resize(plan->manifest.files.size(), 0);
  for (const std::string& name : e.files)
    for (size_t f = 0; f < plan->manifest.files.size(); ++f)
      if (plan->manifest.files[f].file == name) plan->damaged[f] = 1;
  last_ = std::move(plan);
}

bool RunState::write_or_start(int64_t completed, bool last) {
  const auto t0 = Clock::now();
  const CheckpointWriter w = writer(completed);
  const auto group_state = [&](int g) { return state(g); };
  // The run's final checkpoint overlaps the final hash: the snapshot, then rank 0 hashes the
  // parameters while the files are written. Only where the snapshot's second host copy is small
  // or accepted (checkpoint.async); all ranks decide alike (the plan is the same everywhere).
  const bool overlap_hash = last && completed == job_.steps &&
                            (job_.checkpoint.async || w.plan->written_bytes <= kOverlapMaxBytes * world_.size);
  if ((!job_.checkpoint.async || last) && !overlap_hash) {
    std::string path;
    try {
      path = write_checkpoint(w, group_state);
    } catch (const SharedFileDamaged& e) {
      drop_damaged(e);
      return false;
    }
    last_ = w.plan;
    if (world_.rank == 0) {
      THETAD_LOG(info, "ckpt") << "checkpoint written: " << path << " (synchronous: the trainer stalled " << std::fixed
                               << std::setprecision(1) << ms_since(t0) << " ms)";
    }
    return true;
  }
  // The copy happens here, on the trainer thread, so that training may change the state right
  // after; every rank agrees on it at once (a non-finite host parameter stops every rank now, a
  // staged one when the write is agreed: the writer thread reads their flags, not the trainer).
  std::unique_ptr<CheckpointShare> share = spare_ ? std::move(spare_) : std::make_unique<CheckpointShare>();
  WriteStatus st;
  begin_checkpoint(w, st);
  const double begin_ms = ms_since(t0);
  snapshot_share(w, group_state, *share, st);
  const double snapshot_ms = ms_since(t0) - begin_ms;
  agree_checkpoint(w, st, " on another rank");
  // The write's threads: the fewest that finish it within half the time to the next checkpoint
  // (its cadence so far), at most half the rank's cores (the others feed its GPU).
  CheckpointWriter background = w;
  const int64_t every = job_.checkpoint.every_steps;
  const double interval_s = cadence_step_ >= 0 && completed > cadence_step_ && every > 0
      ? std::chrono::duration<double>(t0 - cadence_from_).count() / static_cast<double>(completed - cadence_step_) *
            static_cast<double>(every) : 0.0;
  const int forced = ::thetad::test_hooks::checkpoint_background_threads();
  background.threads = forced > 0 ? forced
                                  : background_checkpoint_threads(share->staged_bytes + share->host_bytes, interval_s,
                                                                  write_bytes_per_thread_s_, std::max(1, w.threads / 2));
  cadence_from_ = t0;
  cadence_step_ = completed;
  if (world_.rank == 0) {
    THETAD_LOG(info, "ckpt") << "checkpoint of step " << completed << ": directory and barrier " << std::fixed
                             << std::setprecision(1) << begin_ms << " ms, snapshot " << snapshot_ms << " ms ("
                             << std::setprecision(3) << share->staged_bytes / 1e6 << " MB staged on the tensors' device, "
                             << share->host_bytes / 1e6 << " MB copied on the host), agreement " << std::setprecision(1)
                             << ms_since(t0) - begin_ms - snapshot_ms << " ms; files written by " << background.threads
                             << " of " << w.threads << " threads per rank";
  }
  inflight_ = std::make_unique<CheckpointInFlight>(background, std::move(share), ms_since(t0));
  inflight_->abandon_wait = comm_timeout(job_);
  if (!overlap_hash) return true;
  if (world_.rank == 0) {
    const auto t_hash = Clock::now();
    final_hash_ = params_hash();
    THETAD_LOG(info, "ckpt") << "final params hash computed while the final checkpoint was written (" << std::fixed
                             << std::setprecision(1) << ms_since(t_hash) / 1000 << " s)";
  }
  const int64_t drops = damaged_drops_;
  finish_checkpoint(completed);  // the run's last checkpoint is published before it returns
  if (damaged_drops_ != drops) return false;
  if (world_.rank == 0) {
    THETAD_LOG(info, "ckpt") << "final checkpoint and hash: the trainer stalled " << std::fixed << std::setprecision(1)
                             << ms_since(t0) << " ms";
  }
  return true;
}

void RunState::warm_up_checkpoints(int64_t completed) {
  cadence_from_ = Clock::now();  // the first checkpoint's interval: from the run's first step
  cadence_step_ = completed;
  if (job_.checkpoint.dir.empty() || !job_.checkpoint.async || spare_ || inflight_) return;
  // Only where an asynchronous checkpoint follows, and not at this step (its own snapshot would
  // pay the same); the run's last checkpoint is synchronous.
  const int64_t every = job_.checkpoint.every_steps;
  if (every <= 0 || completed % every == 0 || (completed / every + 1) * every >= job_.steps) return;
  const auto t0 = Clock::now();
  const CheckpointWriter w = writer(completed);
  auto share = std::make_unique<CheckpointShare>();
  WriteStatus st;  // a failure here (a non-finite parameter) is the next real checkpoint's to report
  snapshot_share(w, [&](int g) {
    if (homes_.of(g).on_device(g)) return state(g);
    GroupState skip;
    skip.group = g;
    skip.initial = true;
    return skip;
  }, *share, st);
  for (ShardValues& v : share->shards) v.staged.clear();  // the clones go back to the allocator, kept
  share->finite.reset();
  if (world_.rank == 0) {
    THETAD_LOG(info, "ckpt") << "checkpoint warm-up after step " << completed << ": " << std::fixed
                             << std::setprecision(1) << ms_since(t0) << " ms, " << std::setprecision(3)
                             << share->staged_bytes / 1e6 << " MB staged once on the tensors' device (kept for the "
                             << "checkpoints), " << share->host_bytes / 1e6 << " MB copied on the host";
  }
  spare_ = std::move(share);
}

void RunState::poll_checkpoint(int64_t step) {
  if (inflight_) advance_checkpoint(step, false);
}

void RunState::finish_checkpoint(int64_t step) {
  while (inflight_) advance_checkpoint(step - 1, true);  // `step` completed steps: the last step run is step - 1
}

// One control-plane allreduce asks whether every rank's thread is done (`wait`: after waiting for
// this rank's up to comm.timeout_s; one still busy then fails the agreement on every rank). Then
// the ranks agree on the outcome: after the write, rank 0 starts the publish on the thread;
// after the publish, the checkpoint is complete. A failure throws on every rank (the write's
// temporary directory removed, the newest complete checkpoint unchanged).
void RunState::advance_checkpoint(int64_t step, bool wait) {
  CheckpointInFlight& f = *inflight_;
  const auto t0 = Clock::now();
  if (wait) f.wait(comm_timeout(job_));
  const bool done = f.done();
  if (!plane_.all_ok(done, {"allreduce of the checkpoint writers' state", step, -1}) && !wait) {
    f.stall_ms += ms_since(t0);
    return;
  }
  WriteStatus st;
  if (done) st = f.status();
  else st = {false, "the background " + std::string(f.publishing ? "publish" : "write") +
                        " did not finish within comm.timeout_s (" + std::to_string(comm_timeout(job_).count() / 1000) + " s)", {}};
  std::unique_ptr<CheckpointInFlight> failing;  // an error below: the thread joined as it unwinds
  if (!st.ok) failing = std::move(inflight_);
  try {
    agree_checkpoint(f.writer(), st, f.publishing ? " on rank 0" : " on another rank");
  } catch (const SharedFileDamaged& e) {
    drop_damaged(e);  // not published; training goes on, the next checkpoint writes those groups
    return;
  }
  if (!f.publishing) {
    f.publishing = true;
    if (world_.rank == 0) f.publish_in_background();
    f.stall_ms += ms_since(t0);
    return;
  }
  f.stall_ms += ms_since(t0);
  if (world_.rank == 0) {
    THETAD_LOG(info, "ckpt") << "checkpoint written: " << checkpoint_path(f.writer().dir, f.writer().step)
                             << " (asynchronous: the trainer stalled " << std::fixed << std::setprecision(1)
                             << f.stall_ms << " ms in all for it, " << f.snapshot_ms << " ms of them at step "
                             << f.writer().step << "; written and published in the background in " << f.write_ms()
                             << " ms, complete after step " << step + 1 << ")";
  }
  last_ = f.writer().plan;
  spare_ = f.take_share();
  const double bytes = static_cast<double>(spare_->staged_bytes + spare_->host_bytes);
  if (f.write_ms() > 0 && bytes > 0) write_bytes_per_thread_s_ = bytes / (f.write_ms() / 1000) / f.writer().threads;
  inflight_.reset();
}

// FNV-1a over the parameters' own hashes (bytes_hash of each one's values, in registration order),
// so that parameters can be hashed apart, in parallel where their values are drawn again.
uint64_t RunState::params_hash() {
  if (final_hash_) return *final_hash_;  // computed beside the final checkpoint: nothing changed since
  const uint64_t basis = comm::fnv1a64("", 0);
  std::vector<uint64_t> per(groups_.size());
  const InitialHashes initial(homes_, groups_);
  for (size_t i = 0; i < groups_.size();) {
    if (initial.drawn(static_cast<int>(i))) {
      i = static_cast<size_t>(initial.hash_run(static_cast<int>(i), per));
      continue;
    }
    const NamedParam& p = groups_[static_cast<int>(i)];
    const auto bytes = static_cast<size_t>(p.tensor.numel()) * sizeof(float);
    // Hashed where it lives where the home keeps it on the host: no copy of θ (T = 384: 52 GB).
    const Homes::HostValues v = homes_.values_on_host(static_cast<int>(i));
    per[i] = bytes_hash(v.data, bytes, basis);
    ++i;
  }
  return comm::fnv1a64(per.data(), per.size() * sizeof(uint64_t), basis);
}

}  // namespace thetad::daemon
