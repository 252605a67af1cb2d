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
#include "daemon/core/file_checksum.hpp"
#include "daemon/core/manifest.hpp"
#include "daemon/core/torch_zip.hpp"
#include "daemon/state/checkpoint.hpp"
#include "daemon/state/checkpoint_files.hpp"
#include "daemon/state/checkpoint_plan.hpp"

namespace thetad::daemon {
namespace {

using namespace ckpt_files;

fs::path tmp_dir(const CheckpointWriter& w) { return fs::path(w.dir) / (".tmp-" + step_name(w.step)); }

void record_failure(WriteStatus& st, const std::exception& e) {
  st.ok = false;
  st.error = e.what();
}

Error non_finite(const CheckpointWriter& w, const std::string& name, int64_t g) {
  return Error("non-finite parameters after step " + std::to_string(w.step) + ": parameter '" + name + "' of group " +
               std::to_string(g) + " holds NaN or Inf; the checkpoint of step " + std::to_string(w.step) +
               " is not written");
}

// What a snapshot may stage on `device`: its free memory less a margin (max(1 GiB, 5 %)), so that
// the clones never take what the next steps allocate, plus what the caching allocator holds
// unused (the last snapshot's clones, or the warm-up's: RunState::warm_up_checkpoints).
// Unbounded on the host (the test aid).
int64_t stageable_bytes(const c10::Device& device) {
#if THETAD_TORCH_CUDA
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard on(device.index());
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
    const int64_t margin = std::max<int64_t>(int64_t{1} << 30, static_cast<int64_t>(total / 20));
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const int64_t cached = stats.reserved_bytes[0].current - stats.allocated_bytes[0].current;  // [0]: all pools
    return std::max<int64_t>(0, static_cast<int64_t>(free) - margin) + std::max<int64_t>(0, cached);
  }
#endif
  return device.is_cpu() ? std::numeric_limits<int64_t>::max() : 0;
}

// The finiteness of staged parameters, computed on their device and read once per snapshot,
// and what staging may still take.
struct FiniteChecks {
  std::vector<at::Tensor> flags;  // bool scalars, one per staged parameter
  std::vector<std::pair<std::string, int64_t>> names;  // its name and group
  bool staging = true;  // false once the device's budget is spent or a clone failed: host copies from then on
  int64_t stage_left = -1;  // bytes staging may still take (-1: not asked yet; one device per rank)
  int64_t staged_bytes = 0, host_bytes = 0;
};

// One read of every flag: the trainer thread's only wait on the device, and what makes the
// clones complete before the writer thread copies them on whatever stream it has (the flags were
// computed from the clones, after them, on the trainer's stream).
void check_finite(const CheckpointWriter& w, FiniteChecks& c) {
  if (c.flags.empty()) return;
  const at::Tensor all = at::stack(c.flags).to(torch::kCPU);
  const bool* ok = all.data_ptr<bool>();
  for (size_t i = 0; i < c.flags.size(); ++i)
    if (!ok[i]) throw non_finite(w, c.names[i].first, c.names[i].second);
  c.flags.clear();
  c.names.clear();
}

// n floats from `from` into `into`, on up to `threads` threads where n is large: the first
// snapshot writes memory never touched before, and its page faults, not the copy, are the cost
// (1.7 s for 3.2 GB on one thread of the GPU host); they are taken in parallel this way.
void copy_floats(float* into, const float* from, size_t n, int threads) {
  constexpr size_t kPerThread = size_t{1} << 20;  // 4 MiB a thread at least: a thread's start is ~1% of that
  const size_t parts = std::min<size_t>(static_cast<size_t>(std::max(1, threads)), (n + kPerThread - 1) / kPerThread);
  if (parts <= 1) {
    std::memcpy(into, from, n * sizeof(float));
    return;
  }
  const size_t per = (n + parts - 1) / parts;
  for_each_index(parts, static_cast<int>(parts), [&](size_t k) {
    const size_t lo = k * per;
    std::memcpy(into + lo, from + lo, (std::min(n, lo + per) - lo) * sizeof(float));
  });
}

// Copies one shard's groups into `out` (its vectors keep their capacity from the last time):
// "param", "exp_avg" and "exp_avg_sq" (float32, the groups' values one after the other, each
// group in its flat layout: parameters in registration order), "groups" (int64 [count], which
// groups, ascending), "offsets" (int64 [count + 1], where each group starts) and "steps" (int64
// [count]). Never a checkpoint of non-finite
// parameters: it would become the newest and, with keep, replace the last good one (the write
// fails on every rank, exit 1, and its temporary directory goes). Staged (device) parameters
// are checked in check_finite, after the shard.
void snapshot_shard(const CheckpointWriter& w, size_t k, const std::function<GroupState(int)>& group_state,
                    ShardValues& out, FiniteChecks& checks) {
  const CheckpointPlan& plan = *w.plan;
  const std::vector<int64_t>& groups = plan.written_groups[k];
  out.index = plan.written[k];
  out.file = plan.manifest.files[out.index].file;
  out.groups = groups;
  out.param.clear();
  out.exp_avg.clear();
  out.exp_avg_sq.clear();
  out.staged.clear();
  out.offsets.assign(1, 0);
  out.steps.clear();
  // Sized once (group_bytes: 3 floats per value): growing by doubling copied and faulted in
  // twice the memory, seconds for 100 MB on a loaded 2-core machine.
  int64_t values = 0;
  for (int64_t g : groups) values += w.group_bytes[static_cast<size_t>(g)] / (3 * int64_t{sizeof(float)});
  HostFloats* vecs[3] = {&out.param, &out.exp_avg, &out.exp_avg_sq};
  for (auto* v : vecs) v->reserve(static_cast<size_t>(values));
  // Test aid (tests/integration/async_checkpoint.sh): host tensors staged too (cloned on the
  // host), so that the CPU build runs the staged path.
  const bool stage_host = ::thetad::test_hooks::checkpoint_stage_host();
  // Appends a tensor's values. A device tensor is staged: cloned on its device (float32,
  // contiguous), on the trainer's current stream, so that the clone is ordered after the
  // optimizer step that wrote the tensor with no event; its room reserved. Out of device memory:
  // a host copy, as all tensors after it. Host fp32 tensors (the common case, millions of tiny
  // ones) by memcpy, without a LibTorch operation each; anything else through a host copy.
  // Returns the staged clone, if any.
  const auto append = [&](int which, const at::Tensor& t) -> at::Tensor {
    HostFloats& v = *vecs[which];
    if ((!t.device().is_cpu() || stage_host) && checks.staging) {
      if (checks.stage_left < 0) checks.stage_left = stageable_bytes(t.device());
      const int64_t bytes = t.numel() * int64_t{sizeof(float)};
      if (bytes > checks.stage_left) {
        THETAD_LOG(warn, "ckpt") << "checkpoint of step " << w.step << ": not enough free memory on " << t.device()
                                 << " to stage the snapshot; the rest of it is copied to the host";
        checks.staging = false;
      }
    }
    if ((!t.device().is_cpu() || stage_host) && checks.staging) {
      checks.stage_left -= t.numel() * int64_t{sizeof(float)};
      try {
        at::Tensor c = t.detach().to(at::kFloat, false, /*copy=*/true, at::MemoryFormat::Contiguous);
        out.staged.push_back({which, v.size(), c});
        v.resize(v.size() + static_cast<size_t>(c.numel()));  // uninitialised: filled by fill_staged
        checks.staged_bytes += c.numel() * int64_t{sizeof(float)};
        return c;
      } catch (const c10::Error& e) {
        THETAD_LOG(warn, "ckpt") << "checkpoint of step " << w.step << ": staging on " << t.device()
                                 << " failed (" << std::string(e.what_without_backtrace()).substr(0, 200)
                                 << "); the rest of this snapshot is copied to the host";
        checks.staging = false;
      }
    }
    const at::Tensor c = t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous()
                             ? t : t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    const size_t at = v.size();
    v.resize(at + static_cast<size_t>(c.numel()));  // uninitialised: copied in below
    copy_floats(v.data() + at, c.data_ptr<float>(), static_cast<size_t>(c.numel()), w.threads);
    checks.host_bytes += c.numel() * int64_t{sizeof(float)};
    return {};
  };
  for (int64_t g : groups) {
    const GroupState st = group_state(static_cast<int>(g));
    if (st.initial) {  // zero values and step count 0: at its initial values (checkpoint.hpp)
      out.offsets.push_back(static_cast<int64_t>(out.param.size()));
      out.steps.push_back(0);
      continue;
    }
    for (size_t i = 0; i < st.names.size(); ++i) {
      const size_t at = out.param.size();
      const at::Tensor staged = append(0, st.params[i]);
      if (staged.defined()) {
        checks.flags.push_back(at::isfinite(staged).all());
        checks.names.emplace_back(st.names[i], g);
      } else {
        bool finite = true;
        for (size_t k = at; k < out.param.size(); ++k) finite &= std::isfinite(out.param[k]);
        if (!finite) throw non_finite(w, st.names[i], g);
      }
      append(1, st.exp_avg[i]);
      append(2, st.exp_avg_sq[i]);
    }
    out.offsets.push_back(static_cast<int64_t>(out.param.size()));
    out.steps.push_back(st.steps);
  }
}

// The writer's side of staging, for the bytes [from, from + n) of vector `vec`'s record: the
// shard's clones that overlap them copied into their room in the host vectors (device to host,
// synchronous; the clones are complete, check_finite), by the thread that writes those bytes next. `staged` is in order of `at` per vector.
void fill_staged(ShardValues& v, int vec, uint64_t from, uint64_t n) {
  HostFloats* vecs[3] = {&v.param, &v.exp_avg, &v.exp_avg_sq};
  const size_t lo = static_cast<size_t>(from / sizeof(float)), hi = static_cast<size_t>((from + n + 3) / sizeof(float));
  for (const ShardValues::Staged& s : v.staged) {
    const size_t end = s.at + static_cast<size_t>(s.values.numel());
    if (s.vec != vec || end <= lo || s.at >= hi) continue;
    const size_t a = std::max(lo, s.at), b = std::min(hi, end);
    float* into = vecs[vec]->data() + a;
#if THETAD_TORCH_CUDA
    // A pool stream (non-blocking): on the legacy default stream each of a file's many block
    // copies would wait for the trainer's queued work. The clone is complete (check_finite).
    std::optional<c10::cuda::CUDAStreamGuard> on;
    if (s.values.is_cuda()) on.emplace(c10::cuda::getStreamFromPool(false, s.values.device().index()));
#endif
    torch::from_blob(into, {static_cast<int64_t>(b - a)}, at::kFloat)
        .copy_(s.values.view({-1}).narrow(0, static_cast<int64_t>(a - s.at), static_cast<int64_t>(b - a)));
  }
}

// A shard's values as one torch.load-able dict of six tensors (a tensor per parameter would
// make a million tiny tasks millions of records, minutes to write): the pickle from LibTorch's
// Pickler, the archive around it laid out and written by daemon/core/torch_zip.hpp straight from
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

// "shard fnv1a64" per line: rank 0 puts them in the manifest. (The test aids apply here too: a
// rank without a shard writes this file.)
void write_sums(const CheckpointWriter& w, const std::string& text, const std::atomic<bool>* cancel) {
  const fs::path file = tmp_dir(w) / checksum_part(w.rank);
  test_hooks(w, file, cancel);
  write_file_durable(file, std::vector<char>(text.begin(), text.end()));
}

}  // namespace

void begin_checkpoint(const CheckpointWriter& w, WriteStatus& st) {
  if (w.rank == 0) {
    try {
      check_lock_held(w.dir, w.step);  // never recreated: it was made and locked before step 0
      remove_tree(tmp_dir(w));  // left over from a run killed mid-write
      fs::create_directory(tmp_dir(w));  // not its parent: a checkpoint.dir removed since stays gone
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
    check_finite(w, checks);
  } catch (const std::exception& e) {
    record_failure(st, e);
    for (ShardValues& v : share.shards) v.staged.clear();  // no write follows: the clones go now
  }
  share.shards.resize(n);
  share.staged_bytes = checks.staged_bytes;
  share.host_bytes = checks.host_bytes;
}

void write_share(const CheckpointWriter& w, CheckpointShare& share, WriteStatus& st,
                 const std::atomic<bool>* cancel) {
  if (!st.ok) return;
  try {
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
// stays what it was.
void agree_checkpoint(const CheckpointWriter& w, const WriteStatus& st, const char* elsewhere) {
  if (w.all_ok(st.ok)) return;
  std::string removed, error = st.error;
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
  m.init_from = w.init_from;
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
  // The files of unchanged groups: the newest complete checkpoint's, shared (hard links; a copy
  // where the filesystem has none), their checksums its manifest's.
  for (size_t f = 0; f < m.files.size(); ++f) {
    if (summed[f]) continue;
    const fs::path from = fs::path(plan.prev_dir) / m.files[f].file;
    const bool linked = link_or_copy(from, tmp / m.files[f].file, m.files[f].fnv1a64);
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
                           << " MB in " << shared_files << " files, " << std::setprecision(2) << s_taken << " s"
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
