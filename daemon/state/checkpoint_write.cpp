// Writing checkpoints, in the phases that let the file work leave the trainer thread: begin
// (rank 0 makes the temporary directory), snapshot (the rank's shards copied out of training
// state), write (pickle, write and fsync: any thread, no collective), publish (every rank agrees,
// rank 0 writes the manifest and renames). See checkpoint.hpp for the layout and protocol.
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>

#if THETAD_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <thread>

#include "comm/bucket_plan.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/test_hooks.hpp"
#include "daemon/checkpoint_format/file_checksum.hpp"
#include "daemon/checkpoint_format/manifest.hpp"
#include "daemon/checkpoint_format/torch_zip.hpp"
#include "daemon/state/checkpoint.hpp"
#include "daemon/state/checkpoint_files.hpp"
#include "daemon/state/checkpoint_plan.hpp"
#include "daemon/state/checkpoint_snapshot.hpp"

namespace thetad::daemon {
namespace {

using namespace ckpt_files;

fs::path tmp_dir(const CheckpointWriter& w) { return fs::path(w.dir) / (".tmp-" + step_name(w.step)); }

// A shard's values as one torch.load-able dict of six tensors (a tensor per parameter would
// make a million tiny tasks millions of records, minutes to write): the pickle from LibTorch's
// Pickler, the archive around it laid out and written by daemon/checkpoint_format/torch_zip.hpp straight from
// the host vectors on `threads` threads, each writing, CRC'ing and checksumming its blocks (a
// single writer thread that computes the CRC, then the checksum, then writes, is their sum).
// Staged values are copied to the host by the same threads, block by block. Returns the checksum.
uint64_t write_pickled(const CheckpointWriter& w, const fs::path& path, ShardValues& v,
                       const std::atomic<bool>* cancel) {
  // from_blob: the dict's tensors view the vectors, which outlive the writing below. The
  // pickler only reads them.
  const auto view = [](const auto& vec, at::ScalarType type) {
    return torch::from_blob(const_cast<void*>(static_cast<const void*>(vec.data())),
                            {static_cast<int64_t>(vec.size())}, type);
  };
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("param", view(v.param, at::kFloat));
  dict.insert("exp_avg", view(v.exp_avg, at::kFloat));
  dict.insert("exp_avg_sq", view(v.exp_avg_sq, at::kFloat));
  dict.insert("groups", view(v.groups, at::kLong));
  dict.insert("offsets", view(v.offsets, at::kLong));
  dict.insert("steps", view(v.steps, at::kLong));
  std::vector<char> pkl;
  torch::jit::Pickler pickler([&](const char* p, size_t n) { pkl.insert(pkl.end(), p, p + n); });
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  // The records as torch::jit::writeArchiveAndTensors names them ("data/<key>" in the pickle's
  // order), then the pickle and the format version PyTorch's writer records (3: plain tensors).
  std::vector<TorchZipRecord> records;
  std::vector<int> vec_of;  // per record: the host vector it views (0..2), or -1
  const void* vecs[3] = {v.param.data(), v.exp_avg.data(), v.exp_avg_sq.data()};
  for (const at::Tensor& t : pickler.tensorData()) {
    const void* data = t.storage().data();
    records.push_back({"data/" + std::to_string(records.size()), data, t.storage().nbytes()});
    const auto* it = std::find(std::begin(vecs), std::end(vecs), data);
    vec_of.push_back(it == std::end(vecs) || t.storage().nbytes() == 0 ? -1 : static_cast<int>(it - std::begin(vecs)));
  }
  records.push_back({"data.pkl", pkl.data(), pkl.size()});
  records.push_back({"version", "3\n", 2});
  vec_of.resize(records.size(), -1);
  DurableFile out(path);
  TorchZipSink sink;
  sink.threads = w.threads;
  sink.write_at = [&](const char* p, size_t n, uint64_t off) { return out.write_at(p, n, off); };
  sink.written = [&](uint64_t off, uint64_t n) { out.start_writeback(off, n); };
  if (!v.staged.empty())
    sink.prepare = [&](size_t r, uint64_t from, uint64_t n) {
      if (vec_of[r] >= 0) fill_staged(v, vec_of[r], from, n);
    };
  sink.cancel = cancel;
  TorchZipResult written;
  try {
    written = write_torch_zip(records, sink);
  } catch (...) {
    v.staged.clear();  // no write follows: the clones go now
    throw;
  }
  v.staged.clear();  // the clones go once copied
  if (cancel && cancel->load()) throw Error("checkpoint of step " + std::to_string(w.step) + ": write cancelled");
  if (!written.ok) out.fail("write failed");
  out.commit();
  return written.checksum;
}

// Test aids, read only here (docs/configuration.md, tests/integration/async_checkpoint.sh):
// THETAD_TEST_CHECKPOINT_WRITE_DELAY_MS sleeps that long before each shard file (a slow disk, so
// that a test can kill a run while a write is in flight); THETAD_TEST_CHECKPOINT_ENOSPC_RANK=r
// makes rank r's shard writes fail as a full disk does. A cancelled write stops in the delay.
void test_hooks(const CheckpointWriter& w, const fs::path& file, const std::atomic<bool>* cancel) {
  const int64_t delay_ms = ::thetad::test_hooks::checkpoint_write_delay_ms();
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(delay_ms);
  while (std::chrono::steady_clock::now() < until && !(cancel && cancel->load()))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (::thetad::test_hooks::checkpoint_enospc_rank() == w.rank) {
    errno = ENOSPC;
    io_error("short write to", file);
  }
}

// Pickles, writes and syncs one shard; returns the checksum of its bytes.
uint64_t write_shard(const CheckpointWriter& w, ShardValues& v, const std::atomic<bool>* cancel) {
  const fs::path file = tmp_dir(w) / v.file;
  test_hooks(w, file, cancel);
  if (cancel && cancel->load()) throw Error("checkpoint of step " + std::to_string(w.step) + ": write cancelled");
  return write_pickled(w, file, v, cancel);
}

// What rank 0 says of shared files found damaged at publish: which, the other checkpoints that
// hold them too (the same inode: hard links), and what happens now.
std::string damaged_message(const CheckpointWriter& w, const std::vector<std::string>& files) {
  std::string text = "checkpoint of step " + std::to_string(w.step) + " not published: ";
  for (size_t i = 0; i < files.size(); ++i) {
    const fs::path p = fs::path(w.plan->prev_dir) / files[i];
    text += (i ? "; " : "") + p.string() + " no longer matches its checksum (damaged on disk since it was written)";
    const std::vector<std::string> holders = checkpoints_holding(p, w.dir);
    if (!holders.empty()) {
      text += ", and so do the checkpoints that hold it by hard link:";
      for (const std::string& h : holders) text += " " + h;
    }
  }
  return text + ". It is not shared into new checkpoints: the groups it holds are written anew from training's state "
                "(resume only from a checkpoint published after this)";
}

// "shard fnv1a64" per line: rank 0 puts them in the manifest. (The test aids apply here too: a
// rank without a shard writes this file.)
void write_sums(const CheckpointWriter& w, const std::string& text, const std::atomic<bool>* cancel) {
  const fs::path file = tmp_dir(w) / checksum_part(w.rank);
  test_hooks(w, file, cancel);
  write_file_durable(file, std::vector<char>(text.begin(), text.end()));
}

}  // namespace

void record_failure(WriteStatus& st, const std::exception& e) {
  st.ok = false;
  st.error = e.what();
  if (const auto* d = dynamic_cast<const SharedFileDamaged*>(&e)) st.damaged = d->files;
}

void begin_checkpoint(const CheckpointWriter& w, WriteStatus& st) {
  if (w.rank == 0) {
    try {
      check_lock_held(w.dir, w.step);  // never recreated: it was made and locked before step 0
      remove_tree(tmp_dir(w));  // left over from a run killed mid-write (a link there: the link)
      // Private, and made here or not at all: not its parent (a checkpoint.dir removed since stays
      // gone), never one that exists again (planted since the removal).
      if (::mkdir(tmp_dir(w).c_str(), 0700) != 0) io_error("cannot create", tmp_dir(w));
    } catch (const std::exception& e) {
      record_failure(st, e);
    }
  }
  w.barrier();
}

void snapshot_share(const CheckpointWriter& w, const std::function<GroupState(int)>& group_state,
                    CheckpointShare& share, WriteStatus& st) {
  size_t n = 0;
  FiniteChecks checks;
  try {
    for (size_t k = static_cast<size_t>(w.rank); k < w.plan->written.size(); k += static_cast<size_t>(w.world), ++n) {
      if (share.shards.size() <= n) share.shards.emplace_back();
      snapshot_shard(w, k, group_state, share.shards[n], checks);
    }
    launch_finite_check(checks);  // read by write_share: the trainer does not wait for it
  } catch (const std::exception& e) {
    record_failure(st, e);
    for (ShardValues& v : share.shards) v.staged.clear();  // no write follows: the clones go now
    checks.runs.clear();
  }
  share.shards.resize(n);
  share.staged_bytes = checks.staged_bytes;
  share.host_bytes = checks.host_bytes;
  share.finite = st.ok ? std::make_shared<FiniteChecks>(std::move(checks)) : nullptr;
}

void write_share(const CheckpointWriter& w, CheckpointShare& share, WriteStatus& st,
                 const std::atomic<bool>* cancel) {
  if (!st.ok) return;
  try {
    // The staged parameters' finiteness first: a non-finite one fails the write (and, at its
    // agreement, the checkpoint on every rank) before any file.
    if (share.finite) check_finite(w, *share.finite);
    share.finite.reset();
    std::ostringstream sums;
    for (ShardValues& v : share.shards) sums << v.index << " " << write_shard(w, v, cancel) << "\n";
    write_sums(w, sums.str(), cancel);
  } catch (const std::exception& e) {
    record_failure(st, e);
  }
}

// Every rank learns whether all succeeded; each throws the same way if not. A failed write
// (a full disk) leaves no temporary directory behind to fill the disk further: rank 0 removes
// it once every rank has stopped writing (the agreement), and the newest complete checkpoint
// stays what it was. Where rank 0 found shared files damaged, every rank learns which
// (SharedFileDamaged), so that all plan the next checkpoint alike without them.
void agree_checkpoint(const CheckpointWriter& w, const WriteStatus& st, const char* elsewhere) {
  if (w.all_ok(st.ok)) return;
  std::string removed, error = st.error, damaged;
  if (w.rank == 0) {
    // A write that failed because checkpoint.dir was removed under it says so, not the I/O error.
    try {
      check_lock_held(w.dir, w.step);
    } catch (const Error& e) {
      error = e.what();
    }
    try {
      remove_tree(tmp_dir(w));
      removed = "; " + tmp_dir(w).string() + " removed";
    } catch (const std::exception& e) {
      removed = "; could not remove " + tmp_dir(w).string() + ": " + e.what();
    }
    for (const std::string& f : st.damaged) damaged += f + "\n";
    if (!damaged.empty()) damaged += error;  // the files, then the message
  }
  if (w.broadcast) damaged = w.broadcast(damaged);
  if (!damaged.empty()) {
    std::vector<std::string> files;
    size_t at = 0;
    for (size_t nl; (nl = damaged.find('\n', at)) != std::string::npos; at = nl + 1)
      files.push_back(damaged.substr(at, nl - at));
    throw SharedFileDamaged(damaged.substr(at), std::move(files));
  }
  throw Error("checkpoint at step " + std::to_string(w.step) + " failed" +
              (error.empty() ? std::string(elsewhere) : ": " + error) + removed +
              " (the newest complete checkpoint in " + w.dir + " is unchanged)");
}

// Rank 0 publishes: the manifest last, the directory renamed into place once everything in it
// is on disk, then the rename itself synced.
void publish_files(const CheckpointWriter& w) {
  const fs::path root(w.dir), tmp = tmp_dir(w), final_dir = root / step_name(w.step);
  const CheckpointPlan& plan = *w.plan;
  Manifest m = plan.manifest;
  m.job = w.job_name;
  m.job_hash = w.job_hash;
  m.step = w.step;
  m.world_size = w.world;
  m.layout = w.layout;
  m.init = w.init;
  std::vector<uint8_t> summed(m.files.size(), 0);
  for (int r = 0; r < w.world; ++r) {  // every rank's checksums, then its part file goes
    const fs::path part = tmp / checksum_part(r);
    std::ifstream in(part);
    size_t f = 0;
    uint64_t sum = 0;
    while (in >> f >> sum) {
      THETAD_CHECK(f < m.files.size(), InternalError, part.string(), ": file ", f);
      m.files[f].fnv1a64 = sum;
      summed[f] = 1;
    }
    fs::remove(part);
  }
  int64_t written = 0, shared = 0, written_files = 0, shared_files = 0;
  for (size_t f : plan.written) {
    THETAD_CHECK(summed[f], InternalError, "checkpoint: no checksum for ", m.files[f].file);
    written += static_cast<int64_t>(fs::file_size(tmp / m.files[f].file));
    ++written_files;
  }
  // The files of unchanged groups: the newest complete checkpoint's, their checksums its
  // manifest's. Each is verified against its checksum first: one damaged on disk since would
  // otherwise spread, by hard link, into every later checkpoint (SharedFileDamaged: this one is
  // not published, the next writes its groups anew). Then shared (hard links; a copy where the
  // filesystem has none).
  const auto t_verify = std::chrono::steady_clock::now();
  std::vector<std::string> damaged;
  for (size_t f = 0; f < m.files.size(); ++f)
    if (!summed[f] && !file_matches(fs::path(plan.prev_dir) / m.files[f].file, m.files[f].fnv1a64, w.threads))
      damaged.push_back(m.files[f].file);
  if (!damaged.empty()) throw SharedFileDamaged(damaged_message(w, damaged), damaged);
  const double verify_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_verify).count();
  for (size_t f = 0; f < m.files.size(); ++f) {
    if (summed[f]) continue;
    const fs::path from = fs::path(plan.prev_dir) / m.files[f].file;
    const bool linked = link_or_copy(from, tmp / m.files[f].file);
    const auto bytes = static_cast<int64_t>(fs::file_size(tmp / m.files[f].file));
    (linked ? shared : written) += bytes;
    ++(linked ? shared_files : written_files);
  }
  for (size_t f : plan.written) w.plan->manifest.files[f].fnv1a64 = m.files[f].fnv1a64;
  const std::string s = manifest_json(m);
  write_file_durable(tmp / "manifest.json", std::vector<char>(s.begin(), s.end()));
  sync_dir(tmp);
  remove_checkpoint(final_dir);  // the same step written before (a rerun): replaced whole
  fs::rename(tmp, final_dir);
  sync_dir(root);
  prune(root, w.step, w.keep);
  const double s_taken = std::chrono::duration<double>(std::chrono::steady_clock::now() - w.started).count();
  THETAD_LOG(info, "ckpt") << "checkpoint step " << w.step << ": wrote " << std::fixed << std::setprecision(1)
                           << written / 1e6 << " MB in " << written_files << " files, linked " << shared / 1e6
                           << " MB in " << shared_files << " files (verified in " << std::setprecision(2) << verify_s
                           << " s), " << s_taken << " s"
                           << (plan.compacted_files ? " (" + std::to_string(plan.compacted_files) +
                                                          " mostly stale files rewritten)" : std::string());
}

std::string publish_checkpoint(const CheckpointWriter& w, WriteStatus st) {
  agree_checkpoint(w, st, " on another rank");
  if (w.rank == 0) try {
    publish_files(w);
  } catch (const std::exception& e) {
    record_failure(st, e);
  }
  agree_checkpoint(w, st, " on rank 0");
  return checkpoint_path(w.dir, w.step);
}

// The synchronous checkpoint: one shard copied out at a time (no second host copy of the whole
// share), pickled and written before the next.
std::string write_checkpoint(const CheckpointWriter& w, const std::function<GroupState(int)>& group_state) {
  WriteStatus st;
  begin_checkpoint(w, st);
  if (st.ok) try {
    std::ostringstream sums;
    ShardValues v;
    FiniteChecks checks;
    for (size_t k = static_cast<size_t>(w.rank); k < w.plan->written.size(); k += static_cast<size_t>(w.world)) {
      snapshot_shard(w, k, group_state, v, checks);
      check_finite(w, checks);
      sums << v.index << " " << write_shard(w, v, nullptr) << "\n";
    }
    write_sums(w, sums.str(), nullptr);
  } catch (const std::exception& e) {
    record_failure(st, e);
  }
  return publish_checkpoint(w, st);
}

}  // namespace thetad::daemon
