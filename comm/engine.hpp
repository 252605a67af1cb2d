// The pruned, bucketed allreduce engine (torch-free). It owns the flat gradient buffers (one per
// bucket, or as GradMemory says; parameters' gradients are views into them), learns before backward which groups any
// rank uses (an async int32 SUM of per-group flags), and during backward launches the buckets of
// globally active groups in bucket-index order as they fill; buckets no rank used are skipped.
//
// One optimizer step ("window" of accumulate_steps micro-steps):
//   engine.start_window(step);                 // zero the buffers that were written
//   for each micro-step m:
//     engine.declare_active(local_groups);     // declared mode: before forward
//     forward; (discover mode: declare_active(groups found in the graph))
//     if last micro-step: engine.begin_sync(); // async count exchange of the window's union
//     backward -> hooks call engine.mark_ready(param) (launches only in the last micro-step)
//   engine.finish_backward();                  // launch the rest, wait, divide; grads final
//   engine.stats()
// Every call that may launch buckets returns them (Launches), as c10d's collectives return their
// Work: the caller consumes each (orders a copy or an optimizer step after its work) once the
// engine's lock is released, so a consumer may call the engine again.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/bucket_plan.hpp"
#include "comm/communicator.hpp"

namespace thetad::comm {

enum class Average { contributors, world };

// How the engine holds one group's gradient memory (EngineOptions::grad_memory, per group).
enum class GradMemory {
  // A buffer per bucket for the engine's lifetime; gradients accumulate into it (mark_ready
  // after an add) and start_window zeroes the buckets that were written.
  owned,
  // Owned buffers, but the first mark_ready of a parameter in a window means its whole gradient
  // region was overwritten (the caller copied the gradient in, as DDP does), not added to. Such
  // buckets are not zeroed at start_window; at launch the engine zeroes only the regions of
  // parameters that got no gradient in the window. That saves a memset of the bucket and the
  // accumulate's extra read each step. The buffers of an overwrite group that no rank used in a
  // window are not zero after finish_backward: they hold stale values (the group is not
  // stepped; lazy semantics).
  overwrite,
  // Not held for the engine's lifetime: the group's buckets come from a pool of group-sized
  // buffers bound per window to the groups in use (the offloaded θ[t]: device memory for their
  // gradients follows the active groups, not T). grad(p) of such a group is valid for the
  // current window only.
  pooled,
  // The group's buckets hold one parameter each (ParamInfo::alone) and no engine memory: the
  // caller hands each gradient over in the window's last micro-step with mark_ready(param,
  // data, keep), in memory of its own, and the engine reduces it there in place. `keep` is held
  // until the bucket's work has completed (polled) or, at the latest, until finish_backward has
  // made the wait stream (or the host) wait for it; the bucket's Launched is where the caller
  // consumes the reduced values (e.g. a device->host copy ordered after `work`). Memory for such a group
  // follows the buckets in flight, not the group's size: the row shards of a huge output layer.
  // grad(p) is an error.
  streamed,
  // The group never has a gradient (a frozen base): its parameters are planned with no
  // elements, so it has no bucket, no memory and no launch. grad(p) is an error.
  none,
  // A world of one rank only (InternalError otherwise), float32 on the wire: a gradient stays in
  // the memory autograd made for it, as a plain loop keeps it: no engine memory, no copy into a
  // bucket and no reduction (one rank's sum is its gradient). The caller gives each parameter's
  // address with adopt() before its mark_ready (every micro-step: the same address), valid until
  // the next start_window. A bucket "launches" as Communicator::after_compute (its Launched has
  // `data` nullptr: read adopted_grad); a parameter of a launched bucket whose group some rank
  // used but that got no gradient reads zeros (engine memory held for the window).
  adopted,
};

struct EngineOptions {
  bool prune = true;
  Average average = Average::contributors;
  bool declared = true;  // declared mode: a gradient for a group not declared active is an error
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // Per group: how its gradient memory is held (GradMemory); empty = all owned.
  std::vector<GradMemory> grad_memory;
  // Zeroed memory of `bytes` for a streamed bucket that got no gradient here (a group other
  // ranks trained, or a parameter with no gradient); its result is the group's reduced values
  // like any other. Held like `keep`. Empty: the communicator's allocate + zero.
  std::function<std::shared_ptr<void>(size_t bytes)> scratch;
  // Device backends: a stream (cudaStream_t) that finish_backward makes wait for the buckets
  // instead of blocking the host, so the host queues the optimizer and the next step while the
  // last buckets are in flight (as DDP does). comm_wait_ms then counts host time only; measure
  // the stream's stall with events around finish_backward. nullptr: the host waits.
  void* wait_stream = nullptr;
  // The count exchange's communicator (null: the gradients'). With NCCL gradients, a host
  // (MPI) one keeps the exchange off the GPU: on the comm stream it would queue behind the
  // previous step's buckets, and with the host a step ahead the next step's buckets could not
  // launch until then, i.e. not during their backward. Every rank must use the same kind.
  std::shared_ptr<Communicator> count_comm;
  // A bucket whose group exactly one rank used is sent from that rank (AllreduceOptions::
  // from_root: a broadcast, same result) when the world has at least this many ranks; 0 = never.
  // A ring allreduce puts 2(n-1)/n of the bytes on each link, a broadcast 1: from 3 ranks on
  // it moves less (4 ranks: a third less for such buckets).
  int broadcast_min_ranks = 3;
  // The dtype buckets travel in (AllreduceOptions::wire): f32, or bf16 for half the bytes. The
  // buffers and the gradients stay f32 either way.
  DType wire = DType::f32;
};

// Collectives of one kind and the bandwidth they achieved: payload bytes and their own time
// (Work::elapsed_ms), summed; algbw = bytes / ms.
struct CollectiveTime {
  int64_t bytes = 0;
  double ms = 0;
  int count = 0;
};

// A bucket the engine launched, handed back by the call that launched it (mark_ready,
// mark_absent, finish_backward) as c10d hands back a collective's Work. Device backends order
// work after the bucket with work->block_stream(stream) (that bucket's optimizer step, the copy
// of its values to the host); host backends wait.
struct Launched {
  int bucket = -1;
  int contributors = -1;  // ranks that used the bucket's group (-1: not known yet)
  WorkPtr work;
  float* data = nullptr;  // the bucket's reduced values once `work` completes (nullptr: adopted group)
  // A streamed bucket's memory (the caller's gradient or the engine's scratch): held by this
  // record too, so that it outlives the caller's use of `data` even where the engine has seen the
  // work complete and let its own hold go.
  std::shared_ptr<void> keep;
};
using Launches = std::vector<Launched>;
// Where a caller of the engine that is not the launches' consumer sends them (the gradient hooks
// and the homes to the table of homes, which hands each bucket to its group's home).
using LaunchHandler = std::function<void(const Launches&)>;

struct StepStats {
  int64_t step = -1;
  int64_t bytes_allreduced = 0;  // payload bytes of launched buckets (per rank, in the wire dtype)
  int64_t bytes_pruned = 0;      // payload bytes of skipped buckets (wire dtype)
  int buckets_launched = 0;
  int buckets_pruned = 0;
  int buckets_zero_filled = 0;   // launched for groups active on other ranks only
  int buckets_broadcast = 0;     // launched as a broadcast from their one contributor
  int buckets_kept = 0;          // not sent: their group's one contributor keeps the gradient (keep)
  int64_t bytes_kept = 0;        // their payload bytes in the wire dtype (what sending would have cost)
  int declared_without_grad = 0; // params of locally declared groups that got no gradient
  double count_exchange_ms = 0;  // latency of the count exchange
  double comm_wait_ms = 0;       // finish_backward's (host) wait for outstanding buckets
  // Host time, for the timeline: in the communicator's launch calls, and inside finish_backward
  // waiting for the launch order (the counts) and launching what was left.
  double launch_call_ms = 0;
  double finish_order_ms = 0;
  double finish_launch_ms = 0;
  double finish_block_ms = 0;    // making the wait stream (or the host) wait for the buckets
  int64_t streamed_bytes_peak = 0;  // streamed groups: most bytes of handed-over buffers held at once
  int finish_launched = 0;       // buckets that launch_rest and finish_backward launched (not the hooks)
  // The buckets' collectives that completed since the previous window's stats (the host sees a
  // window's last buckets complete only when it waits for them: on GPUs, where it does not, those
  // are counted with the next window), by kind: allreduces (bf16 wire included) and broadcasts
  // from one contributor. A world of one times nothing.
  CollectiveTime allreduce_time;
  CollectiveTime broadcast_time;
  std::vector<int32_t> contributors;  // per group, ranks that used it this window
};

class Engine {
 public:
  Engine(std::shared_ptr<Communicator> comm, BucketPlan plan, EngineOptions opts);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const BucketPlan& plan() const { return plan_; }
  Communicator& communicator() { return *comm_; }

  // Where parameter p's gradient lives (float32, plan.params[p].numel elements, in the
  // communicator's memory kind). Stable for the engine's lifetime, except for pooled groups:
  // there it binds the group to a zeroed pool buffer for the current window if needed, and
  // adopted groups: the adopted address this window (zeros if none came). A parameter without
  // elements gets a valid address that holds none of its gradient.
  float* grad(int param);
  // Bytes of device/host memory the gradient buffers hold now (fixed buckets + pool).
  size_t buffer_bytes() const;
  float* bucket_data(int bucket);

  void start_window(int64_t step);
  // Adds groups (flags of size num_groups) to this window's locally active set.
  void declare_active(const std::vector<uint8_t>& local_groups);
  // Starts the async count exchange for this window; the next backward's hooks launch buckets.
  void begin_sync();
  // Waits for the count exchange (normally long done); contributors per group.
  const std::vector<int32_t>& contributors();
  bool group_active_globally(int group);
  // From the autograd hook after param's gradient has been accumulated. Thread-safe. A
  // parameter without a bucket (no elements in the plan) is ignored. Returns the buckets this
  // call launched (lower-indexed ones that waited for this one's turn included).
  [[nodiscard]] Launches mark_ready(int param);
  // Adopted groups: param's gradient is at `data` (float32, contiguous, plan.params[param].numel
  // elements) until the next start_window. Call before mark_ready(param). Thread-safe.
  void adopt(int param, float* data);
  // Adopted groups: param's gradient this window, once its bucket launched or after
  // finish_backward; nullptr if none was adopted and its bucket has not launched.
  float* adopted_grad(int param) const;
  // Bytes of the gradients adopted this window (memory the caller's allocator holds).
  size_t adopted_bytes() const;
  // Streamed groups: param's whole gradient is at `data` (the communicator's memory kind,
  // plan.params[param].numel floats); `keep` owns that memory (see GradMemory::streamed).
  // Only after begin_sync, once per window. Waits for the count exchange if it has not landed
  // (the launch order needs it; the buffers do not pile up meanwhile).
  [[nodiscard]] Launches mark_ready(int param, float* data, std::shared_ptr<void> keep);
  // Streamed groups: this rank has no gradient for param in this window (a shard without rows in
  // the batch, a group declared but not computed). Its bucket reduces zeros (scratch memory,
  // taken at launch), and later buckets need not wait for finish_backward. Same rules as above.
  [[nodiscard]] Launches mark_absent(int param);
  // Whether this rank declared (or discovered) the group active in the current window.
  bool locally_active(int group) const;
  // This window (before begin_sync): if `rank` turns out to be the group's one contributor, its
  // gradient stays there and nothing is sent: no rank launches the group's buckets, `rank`'s
  // buckets hold its own gradient (divided as a sent one would be: by the world with average
  // world, by 1 otherwise; never rounded to bf16), the others' buckets are not reduced (the
  // caller must not step the group there). The count exchange decides, the same on every rank:
  // with any other contributors the buckets go as usual. Groups whose gradient memory is owned,
  // overwrite or pooled only.
  void keep(int group, int rank);
  // After the count exchange (waits for it): the rank that kept the group's gradient this window,
  // or -1 where it was sent (or nobody used the group).
  int kept_by(int group);
  // Launches every globally active bucket not yet launched (zero-filled where this rank had no
  // gradient), waits for all of them, divides (contributors or world). After it the gradients
  // of every globally active group are final on every rank; others are zero (overwrite groups:
  // unspecified). Returns the buckets it launched (their work already waited for, or the wait
  // stream ordered after it).
  [[nodiscard]] Launches finish_backward();
  // Where the host waits for the buckets (no EngineOptions::wait_stream), the calls above hand
  // back at most one streamed bucket each, so that its caller consumes it (and its memory is
  // given back) before the next one's memory is taken; launch_ready launches what is ready
  // after that (again at most one streamed bucket), launch_rest what is left before
  // finish_backward, as finish_backward would, paced the same way. Callers that consume
  // streamed buckets call them until they return nothing (Homes::take, the step protocol); for
  // the others they are no-ops or finish_backward's launches made earlier.
  [[nodiscard]] Launches launch_ready();
  [[nodiscard]] Launches launch_rest();
  const StepStats& stats() const { return stats_; }

 private:
  struct Impl;
  void mark_locked(int param, Launches& out);
  void check_declared(int param);
  int streamed_bucket(const char* call, int param);
  std::shared_ptr<Communicator> comm_;
  BucketPlan plan_;
  EngineOptions opts_;
  StepStats stats_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace thetad::comm
