// Writing checkpoints, in the phases that let the file work leave the trainer thread: begin
// (rank 0 makes the temporary directory), snapshot (the rank's shards copied out of training
// state), write (pickle, write and fsync: any thread, no collective), publish (every rank agrees,
// rank 0 writes the manifest and renames). See checkpoint.hpp for the layout and protocol.
#include <torch/serialize.h>

#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "comm/bucket_plan.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "daemon/core/manifest.hpp"
#include "daemon/state/checkpoint.hpp"
#include "daemon/state/checkpoint_files.hpp"

namespace thetad::daemon {
namespace {

using namespace ckpt_files;

fs::path tmp_dir(const CheckpointWriter& w) { return fs::path(w.dir) / (".tmp-" + step_name(w.step)); }

void record_failure(WriteStatus& st, const std::exception& e) {
  st.ok = false;
  st.error = e.what();
}

// Copies one shard's groups into `out` (its vectors keep their capacity from the last time):
// "param", "exp_avg" and "exp_avg_sq" (float32, the groups' values one after the other, each
// group in its flat layout: parameters in registration order), "offsets" (int64 [count + 1],
// where each group starts) and "steps" (int64 [count]). Never a checkpoint of non-finite
// parameters: it would become the newest and, with keep, replace the last good one (the write
// fails on every rank, exit 1, and its temporary directory goes).
void snapshot_shard(const CheckpointWriter& w, const ManifestShard& shard, size_t index,
                    const std::function<GroupState(int)>& group_state, ShardValues& out) {
  out.index = index;
  out.file = shard.file;
  out.param.clear();
  out.exp_avg.clear();
  out.exp_avg_sq.clear();
  out.offsets.assign(1, 0);
  out.steps.clear();
  // Sized once (group_bytes: 3 floats per value): growing by doubling copied and faulted in
  // twice the memory, seconds for 100 MB on a loaded 2-core machine.
  int64_t values = 0;
  for (int64_t g = shard.first; g < shard.first + shard.count; ++g)
    values += w.group_bytes[static_cast<size_t>(g)] / (3 * int64_t{sizeof(float)});
  for (auto* v : {&out.param, &out.exp_avg, &out.exp_avg_sq}) v->reserve(static_cast<size_t>(values));
  // Appends a tensor's values: host fp32 tensors (the common case, millions of tiny ones) by
  // memcpy, without a LibTorch operation each; anything else (a device tensor) through a host copy.
  const auto append = [](std::vector<float>& v, const at::Tensor& t) {
    const at::Tensor c = t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous()
                             ? t : t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    const float* p = c.data_ptr<float>();
    v.insert(v.end(), p, p + c.numel());
  };
  for (int64_t g = shard.first; g < shard.first + shard.count; ++g) {
    const GroupState st = group_state(static_cast<int>(g));
    for (size_t i = 0; i < st.names.size(); ++i) {
      const size_t at = out.param.size();
      append(out.param, st.params[i]);
      bool finite = true;
      for (size_t k = at; k < out.param.size(); ++k) finite &= std::isfinite(out.param[k]);
      if (!finite)
        throw Error("non-finite parameters after step " + std::to_string(w.step) + ": parameter '" + st.names[i] +
                    "' of group " + std::to_string(g) + " holds NaN or Inf; the checkpoint of step " +
                    std::to_string(w.step) + " is not written");
      append(out.exp_avg, st.exp_avg[i]);
      append(out.exp_avg_sq, st.exp_avg_sq[i]);
    }
    out.offsets.push_back(static_cast<int64_t>(out.param.size()));
    out.steps.push_back(st.steps);
  }
}

// A shard's values as one torch.load-able dict of five tensors (a tensor per parameter would
// make a million tiny tasks millions of records, minutes to write).
std::vector<char> pickle_shard(const ShardValues& v) {
  // from_blob: the dict's tensors view the vectors, which outlive the pickling below. The
  // pickler only reads them.
  const auto view = [](const auto& vec, at::ScalarType type) {
    return torch::from_blob(const_cast<void*>(static_cast<const void*>(vec.data())),
                            {static_cast<int64_t>(vec.size())}, type);
  };
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("param", view(v.param, at::kFloat));
  dict.insert("exp_avg", view(v.exp_avg, at::kFloat));
  dict.insert("exp_avg_sq", view(v.exp_avg_sq, at::kFloat));
  dict.insert("offsets", view(v.offsets, at::kLong));
  dict.insert("steps", view(v.steps, at::kLong));
  return torch::pickle_save(c10::IValue(dict));
}

int64_t env_int(const char* name, int64_t otherwise) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : otherwise;
}

// Test aids, read only here (docs/configuration.md, tests/integration/async_checkpoint.sh):
// THETAD_TEST_CHECKPOINT_WRITE_DELAY_MS sleeps that long before each shard file (a slow disk, so
// that a test can kill a run while a write is in flight); THETAD_TEST_CHECKPOINT_ENOSPC_RANK=r
// makes rank r's shard writes fail as a full disk does. A cancelled write stops in the delay.
void test_hooks(const CheckpointWriter& w, const fs::path& file, const std::atomic<bool>* cancel) {
  const int64_t delay_ms = env_int("THETAD_TEST_CHECKPOINT_WRITE_DELAY_MS", 0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(delay_ms);
  while (std::chrono::steady_clock::now() < until && !(cancel && cancel->load()))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (env_int("THETAD_TEST_CHECKPOINT_ENOSPC_RANK", -1) == w.rank) {
    errno = ENOSPC;
    io_error("short write to", file);
  }
}

// Pickles, writes and syncs one shard; returns the checksum of its bytes.
uint64_t write_shard(const CheckpointWriter& w, const ShardValues& v, const std::atomic<bool>* cancel) {
  const fs::path file = tmp_dir(w) / v.file;
  test_hooks(w, file, cancel);
  if (cancel && cancel->load()) throw Error("checkpoint of step " + std::to_string(w.step) + ": write cancelled");
  const std::vector<char> bytes = pickle_shard(v);
  write_file_durable(file, bytes);
  return comm::fnv1a64(bytes.data(), bytes.size());
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
      fs::create_directories(w.dir);
      fs::remove_all(tmp_dir(w));  // left over from a run killed mid-write
      fs::create_directories(tmp_dir(w));
    } catch (const std::exception& e) {
      record_failure(st, e);
    }
  }
  w.barrier();
}

void snapshot_share(const CheckpointWriter& w, const std::function<GroupState(int)>& group_state,
                    CheckpointShare& share, WriteStatus& st) {
  const std::vector<ManifestShard> shards = plan_shards(w.group_bytes);
  size_t n = 0;
  try {
    for (size_t s = static_cast<size_t>(w.rank); s < shards.size(); s += static_cast<size_t>(w.world), ++n) {
      if (share.shards.size() <= n) share.shards.emplace_back();
      snapshot_shard(w, shards[s], s, group_state, share.shards[n]);
    }
  } catch (const std::exception& e) {
    record_failure(st, e);
  }
  share.shards.resize(n);
}

void write_share(const CheckpointWriter& w, const CheckpointShare& share, WriteStatus& st,
                 const std::atomic<bool>* cancel) {
  if (!st.ok) return;
  try {
    std::ostringstream sums;
    for (const ShardValues& v : share.shards) sums << v.index << " " << write_shard(w, v, cancel) << "\n";
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
  std::string removed;
  if (w.rank == 0) {
    std::error_code ec;
    fs::remove_all(tmp_dir(w), ec);
    removed = ec ? "; could not remove " + tmp_dir(w).string() + ": " + ec.message() : "; " + tmp_dir(w).string() + " removed";
  }
  throw Error("checkpoint at step " + std::to_string(w.step) + " failed" +
              (st.error.empty() ? std::string(elsewhere) : ": " + st.error) + removed +
              " (the newest complete checkpoint in " + w.dir + " is unchanged)");
}

// Rank 0 publishes: the manifest last, the directory renamed into place once everything in it
// is on disk, then the rename itself synced.
void publish_files(const CheckpointWriter& w) {
  const fs::path root(w.dir), tmp = tmp_dir(w), final_dir = root / step_name(w.step);
  const std::vector<ManifestShard> shards = plan_shards(w.group_bytes);
  Manifest m;
  m.job = w.job_name;
  m.job_hash = w.job_hash;
  m.step = w.step;
  m.world_size = w.world;
  m.num_groups = static_cast<int>(w.group_bytes.size());
  m.shards = shards;
  std::vector<uint8_t> summed(shards.size(), 0);
  for (int r = 0; r < w.world; ++r) {  // every rank's checksums, then its part file goes
    const fs::path part = tmp / checksum_part(r);
    std::ifstream in(part);
    size_t sh = 0;
    uint64_t sum = 0;
    while (in >> sh >> sum) {
      THETAD_CHECK(sh < shards.size(), InternalError, part.string(), ": shard ", sh);
      m.shards[sh].fnv1a64 = sum;
      summed[sh] = 1;
    }
    fs::remove(part);
  }
  for (size_t sh = 0; sh < shards.size(); ++sh)
    THETAD_CHECK(summed[sh], InternalError, "checkpoint: no checksum for ", shards[sh].file);
  const std::string s = manifest_json(m);
  write_file_durable(tmp / "manifest.json", std::vector<char>(s.begin(), s.end()));
  sync_dir(tmp);
  fs::remove_all(final_dir);  // the same step written before (a rerun): replaced whole
  fs::rename(tmp, final_dir);
  sync_dir(root);
  prune(root, w.step, w.keep);
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
    const std::vector<ManifestShard> shards = plan_shards(w.group_bytes);
    std::ostringstream sums;
    ShardValues v;
    for (size_t s = static_cast<size_t>(w.rank); s < shards.size(); s += static_cast<size_t>(w.world)) {
      snapshot_shard(w, shards[s], s, group_state, v);
      sums << s << " " << write_shard(w, v, nullptr) << "\n";
    }
    write_sums(w, sums.str(), nullptr);
  } catch (const std::exception& e) {
    record_failure(st, e);
  }
  return publish_checkpoint(w, st);
}

}  // namespace thetad::daemon
