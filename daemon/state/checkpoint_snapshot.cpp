// The snapshot of a checkpoint (see checkpoint_snapshot.hpp).
#include "daemon/state/checkpoint_snapshot.hpp"

#if THETAD_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/test_hooks.hpp"
#include "common/thread_pool.hpp"
#include "daemon/checkpoint_format/file_checksum.hpp"

namespace thetad::daemon {
namespace {

Error non_finite(const CheckpointWriter& w, const std::string& name, int64_t g) {
  return Error("non-finite parameters after step " + std::to_string(w.step) + ": parameter '" + name + "' of group " +
               std::to_string(g) + " holds NaN or Inf; the checkpoint of step " + std::to_string(w.step) +
               " is not written");
}

bool all_finite(const float* p, size_t n) {
  return std::all_of(p, p + n, [](float x) { return std::isfinite(x); });
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

// n floats from `from` into `into`, on up to `threads` threads where n is large: the first
// snapshot writes memory never touched before, and its page faults, not the copy, are the cost
// (1.7 s for 3.2 GB on one thread of the GPU host); they are taken in parallel this way, on the
// file pool's threads.
void copy_floats(float* into, const float* from, size_t n, int threads) {
  constexpr size_t kPerThread = size_t{1} << 20;  // 4 MiB a thread at least: a hand-off costs ~1% of that
  const size_t parts = std::min<size_t>(static_cast<size_t>(std::max(1, threads)), (n + kPerThread - 1) / kPerThread);
  if (parts <= 1) {
    std::memcpy(into, from, n * sizeof(float));
    return;
  }
  const size_t per = (n + parts - 1) / parts;
  ThreadPool::files().parallel_for(parts, [&](size_t k) {
    const size_t lo = k * per;
    std::memcpy(into + lo, from + lo, (std::min(n, lo + per) - lo) * sizeof(float));
  }, parts);
}

// Runs of device tensors bound for consecutive room in one host vector, cloned as one flat
// tensor (at::cat) when the run ends: a few kernels per snapshot where a clone per tensor was
// 24,576 of them for 64 LoRA adapters (and as many small copies to the host afterwards).
struct PendingRun {
  size_t at = 0;  // where the run's values go in the vector
  std::vector<at::Tensor> parts;
  std::vector<std::tuple<std::string, int64_t, int64_t, int64_t>> params;  // vector 0: name, group, offset, count
};

#if THETAD_TORCH_CUDA
// The shard's GPU clones copied on to pinned host memory (ShardValues::pinned), on a pool stream
// after the clones (the trainer's current stream), asynchronously: the trainer does not wait.
void copy_to_pinned(ShardValues& out) {
  int64_t total = 0;
  for (const ShardValues::Staged& s : out.staged)
    if (s.values.is_cuda()) total += s.values.numel();
  if (total == 0) return;
  const c10::Device device = out.staged.front().values.device();
  if (!out.pinned.defined() || out.pinned.numel() < total)
    out.pinned = at::empty({total}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
  const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device.index());
  const c10::cuda::CUDAStream copies = c10::cuda::getStreamFromPool(false, device.index());
  at::cuda::CUDAEvent cloned;
  cloned.record(compute);
  cloned.block(copies);
  const c10::cuda::CUDAStreamGuard on(copies);
  int64_t at = 0;
  for (ShardValues::Staged& s : out.staged) {
    if (!s.values.is_cuda()) continue;
    out.pinned.narrow(0, at, s.values.numel()).copy_(s.values.view({-1}), /*non_blocking=*/true);
    c10::cuda::CUDACachingAllocator::recordStream(s.values.storage().data_ptr(), copies);
    s.pinned_at = at;
    at += s.values.numel();
  }
  auto ready = std::make_shared<at::cuda::CUDAEvent>();
  ready->record(copies);
  out.pinned_ready = std::move(ready);
}
#endif

}  // namespace

// Copies one shard's groups into `out` (its vectors keep their capacity from the last time):
// "param", "exp_avg" and "exp_avg_sq" (float32, the groups' values one after the other, each
// group in its flat layout: parameters in registration order), "groups" (int64 [count], which
// groups, ascending), "offsets" (int64 [count + 1], where each group starts) and "steps" (int64
// [count]). Never a checkpoint of non-finite parameters: it would become the newest and, with
// keep, replace the last good one (the write fails on every rank, exit 1, and its temporary
// directory goes). Host copies are checked here, staged (device) parameters on their device;
// check_finite says the outcome.
void snapshot_shard(const CheckpointWriter& w, size_t k, const std::function<GroupState(int)>& group_state,
                    ShardValues& out, FiniteChecks& checks) {
  // Thousands of small tensors per snapshot (a LoRA adapter has 8 per layer): with autograd's
  // bookkeeping off, each costs a view and its share of a cat, not a detach and a graph node.
  const c10::InferenceMode no_autograd;
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
  PendingRun runs[3];
  // Said by check_finite, not thrown here: a checkpoint in the background is refused when its
  // write is agreed, after the trainer read the step's loss (which a stop names first).
  const auto host_non_finite = [&](const std::string& name, int64_t g) {
    if (checks.host_error.empty()) checks.host_error = non_finite(w, name, g).what();
  };
  // A host tensor's values into the vector at `at` (room already there).
  const auto host_copy = [&](int which, size_t at, const at::Tensor& t) {
    const at::Tensor c = t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous()
                             ? t : t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    copy_floats(vecs[which]->data() + at, c.data_ptr<float>(), static_cast<size_t>(c.numel()), w.threads);
    checks.host_bytes += c.numel() * int64_t{sizeof(float)};
  };
  // Ends vector `which`'s run: one flat clone on the trainer's current stream (ordered after the
  // optimizer step that wrote the tensors, with no event), its room reserved already. A clone
  // that fails (out of memory) makes the run, and everything after it, host copies.
  const auto end_run = [&](int which) {
    PendingRun& run = runs[which];
    if (run.parts.empty()) return;
    at::Tensor flat;
    if (checks.staging) {
      try {
        std::vector<at::Tensor> flats;
        flats.reserve(run.parts.size());
        for (const at::Tensor& t : run.parts) {
          at::Tensor f = t.is_contiguous() ? t.view({-1}) : t.reshape({-1});
          flats.push_back(f.scalar_type() == at::kFloat ? std::move(f) : f.to(at::kFloat));
        }
        flat = at::cat(flats);
      } catch (const c10::Error& e) {
        THETAD_LOG(warn, "ckpt") << "checkpoint of step " << w.step << ": staging on " << run.parts.front().device()
                                 << " failed (" << std::string(e.what_without_backtrace()).substr(0, 200)
                                 << "); the rest of this snapshot is copied to the host";
        checks.staging = false;
      }
    }
    if (flat.defined()) {
      out.staged.push_back({which, run.at, flat});
      checks.staged_bytes += flat.numel() * int64_t{sizeof(float)};
      if (which == 0) {
        checks.flags.push_back(at::isfinite(flat).all());
        checks.runs.push_back({flat, std::move(run.params)});
      }
    } else {
      size_t at = run.at;
      for (const at::Tensor& t : run.parts) {
        host_copy(which, at, t);
        at += static_cast<size_t>(t.numel());
      }
      for (const auto& [name, g, off, n] : run.params) {
        const float* p = vecs[0]->data() + run.at + off;
        if (!all_finite(p, static_cast<size_t>(n))) host_non_finite(name, g);
      }
    }
    run = PendingRun{};
  };
  // Appends a tensor's values: a device tensor joins its vector's run while the device's budget
  // lasts; anything else ends that run and is copied now (host fp32 tensors, the common case of
  // millions of tiny ones, by memcpy without a LibTorch operation each). Returns whether staged.
  const auto append = [&](int which, const at::Tensor& t) -> bool {
    HostFloats& v = *vecs[which];
    const int64_t bytes = t.numel() * int64_t{sizeof(float)};
    const bool device = !t.device().is_cpu() || stage_host;
    if (device && checks.staging) {
      if (checks.stage_left < 0) checks.stage_left = stageable_bytes(t.device());
      if (bytes > checks.stage_left) {
        THETAD_LOG(warn, "ckpt") << "checkpoint of step " << w.step << ": not enough free memory on " << t.device()
                                 << " to stage the snapshot; the rest of it is copied to the host";
        checks.staging = false;
      }
    }
    if (device && checks.staging) {
      checks.stage_left -= bytes;
      PendingRun& run = runs[which];
      if (run.parts.empty()) run.at = v.size();
      run.parts.push_back(t);  // no autograd here (InferenceMode): no detach per tensor
      v.resize(v.size() + static_cast<size_t>(t.numel()));  // uninitialised: filled by fill_staged
      return true;
    }
    end_run(which);
    const size_t at = v.size();
    v.resize(at + static_cast<size_t>(t.numel()));  // uninitialised: copied in now
    host_copy(which, at, t);
    return false;
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
      if (append(0, st.params[i])) {
        PendingRun& run = runs[0];
        run.params.emplace_back(st.names[i], g, static_cast<int64_t>(at - run.at), st.params[i].numel());
      } else {
        if (!all_finite(out.param.data() + at, out.param.size() - at)) host_non_finite(st.names[i], g);
      }
      append(1, st.exp_avg[i]);
      append(2, st.exp_avg_sq[i]);
    }
    out.offsets.push_back(static_cast<int64_t>(out.param.size()));
    out.steps.push_back(st.steps);
  }
  for (int which = 0; which < 3; ++which) end_run(which);
  out.pinned_ready.reset();
#if THETAD_TORCH_CUDA
  copy_to_pinned(out);
#endif
}

// The flags stacked and copied to (pinned) host memory on the trainer's current stream, after
// the clones they were computed from: once that copy is complete, so are the clones.
void launch_finite_check(FiniteChecks& c) {
  if (c.flags.empty() || c.host_flags.defined()) return;
  const at::Tensor all = at::stack(c.flags);
#if THETAD_TORCH_CUDA
  if (all.is_cuda()) {
    c.host_flags = at::empty({all.numel()}, at::TensorOptions().dtype(at::kBool).pinned_memory(true));
    c.host_flags.copy_(all, /*non_blocking=*/true);
    auto ready = std::make_shared<at::cuda::CUDAEvent>();
    ready->record(c10::cuda::getCurrentCUDAStream(all.device().index()));
    c.flags_ready = std::move(ready);
    return;
  }
#endif
  c.host_flags = all.to(torch::kCPU);
}

// One read of every flag, and what makes the clones complete before the writer threads copy
// them on whatever stream they have. On the writer thread for a checkpoint in the background,
// so that the trainer never waits for the device. A run that is not finite is searched for its
// first non-finite parameter (a failing run only; on a pool stream, never behind the trainer's
// queued work on the legacy default stream).
void check_finite(const CheckpointWriter& w, FiniteChecks& c) {
  if (!c.host_error.empty()) throw Error(c.host_error);
  if (c.flags.empty()) return;
  launch_finite_check(c);
#if THETAD_TORCH_CUDA
  std::optional<c10::cuda::CUDAStreamGuard> on;
  if (c.flags_ready) {
    static_cast<at::cuda::CUDAEvent*>(c.flags_ready.get())->synchronize();
    on.emplace(c10::cuda::getStreamFromPool(false, c.flags.front().device().index()));
  }
#endif
  const bool* ok = c.host_flags.data_ptr<bool>();
  for (size_t i = 0; i < c.flags.size(); ++i) {
    if (ok[i]) continue;
    for (const auto& [name, g, off, n] : c.runs[i].params)
      if (!at::isfinite(c.runs[i].values.narrow(0, off, n)).all().item<bool>()) throw non_finite(w, name, g);
  }
  c.flags.clear();
  c.runs.clear();
  c.host_flags = at::Tensor();
  c.flags_ready.reset();
}

// The writer's side of staging, for the bytes [from, from + n) of vector `vec`'s record: the
// shard's clones that overlap them copied into their room in the host vectors (from pinned memory
// once their copies there completed; else device to host, synchronous: the clones are complete,
// check_finite, which write_share runs first), by the thread that writes those bytes next.
void fill_staged(ShardValues& v, int vec, uint64_t from, uint64_t n) {
  HostFloats* vecs[3] = {&v.param, &v.exp_avg, &v.exp_avg_sq};
  const size_t lo = static_cast<size_t>(from / sizeof(float)), hi = static_cast<size_t>((from + n + 3) / sizeof(float));
  for (const ShardValues::Staged& s : v.staged) {
    const size_t end = s.at + static_cast<size_t>(s.values.numel());
    if (s.vec != vec || end <= lo || s.at >= hi) continue;
    const size_t a = std::max(lo, s.at), b = std::min(hi, end);
    float* into = vecs[vec]->data() + a;
#if THETAD_TORCH_CUDA
    if (s.pinned_at >= 0) {  // on its way to pinned memory since the snapshot: a memcpy once there
      static_cast<at::cuda::CUDAEvent*>(v.pinned_ready.get())->synchronize();
      std::memcpy(into, v.pinned.data_ptr<float>() + s.pinned_at + static_cast<int64_t>(a - s.at), (b - a) * sizeof(float));
      continue;
    }
    // A pool stream (non-blocking): on the legacy default stream each of a file's many block
    // copies would wait for the trainer's queued work. The clone is complete (check_finite).
    std::optional<c10::cuda::CUDAStreamGuard> on;
    if (s.values.is_cuda()) on.emplace(c10::cuda::getStreamFromPool(false, s.values.device().index()));
#endif
    torch::from_blob(into, {static_cast<int64_t>(b - a)}, at::kFloat)
        .copy_(s.values.view({-1}).narrow(0, static_cast<int64_t>(a - s.at), static_cast<int64_t>(b - a)));
  }
}

}  // namespace thetad::daemon
