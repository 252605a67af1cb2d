// The engine's window (comm/engine.cpp's Engine::Impl): what one window of the pruned, bucketed
// allreduce engine knows (which groups and parameters were marked, which buckets launched, the
// count exchange, the gradient memory) and the launch order, with the engine's lock `mu`.
// Included by comm/engine.cpp only.
//
// Launch order: the buckets to reduce this window ("order": globally active buckets with prune
// on, every bucket with prune off) are launched strictly in ascending bucket index, the same on
// every rank, as NCCL and MPI both require. A bucket is ready when all its parameters were marked
// since begin_sync, or at once when its group is not locally active (its buffer is zero and no
// gradient will come: it is the zero-filled stand-in for a group other ranks trained). A ready
// bucket waits for the lower-indexed buckets of the order; launch_rest and finish_backward launch
// whatever is left. Where the host waits for the buckets, a call that hands launches back stops
// after a streamed bucket (run's `paced`), so that its memory is consumed before the next one's. The order (and the divisors) need the count exchange, which mark_ready never waits for:
// until it has landed, ready buckets just accumulate. A bucket of a kept group (keep: its one
// contributor keeps the gradient) is in no rank's order: finish_backward finishes it on that rank
// in place.
#pragma once

#include <algorithm>
#include <chrono>
#include <mutex>
#include <vector>

#include "comm/engine.hpp"
#include "comm/engine/collective_timer.hpp"
#include "comm/engine/count_exchange.hpp"
#include "comm/engine/grad_buffers.hpp"

namespace thetad::comm {

struct Engine::Impl {
  using Clock = std::chrono::steady_clock;
  using CollectiveTimer = engine_detail::CollectiveTimer;
  using CountExchange = engine_detail::CountExchange;
  using GradBuffers = engine_detail::GradBuffers;

  Communicator& comm;
  const BucketPlan& plan;
  const EngineOptions& opts;
  StepStats& stats;

  std::mutex mu;
  GradBuffers buffers;
  CountExchange counts;
  std::vector<uint8_t> local_active;           // per group, this window
  std::vector<uint8_t> seen;                   // per param: marked at all in this window
  std::vector<uint8_t> ready;                  // per param: marked since begin_sync
  std::vector<int> pending;                    // per bucket: params not yet ready
  std::vector<uint8_t> launched;               // per bucket
  std::vector<int> keeper;                     // per group, this window: keep(group, rank), else -1
  bool any_keeper = false;
  std::vector<uint8_t> kept;                   // per bucket, once the order is known: not sent
  CollectiveTimer timer;  // the buckets' collectives, into the stats' bandwidth once complete

  bool synced = false;     // begin_sync called in this window
  bool finished = false;   // finish_backward done in this window

  bool order_ready = false;
  std::vector<int> order;  // buckets to reduce this window, ascending
  size_t next = 0;         // position in `order` of the next bucket to launch
  std::vector<WorkPtr> works;

  Impl(Communicator& c, const BucketPlan& p, const EngineOptions& o, StepStats& st)
      : comm(c),
        plan(p),
        opts(o),
        stats(st),
        buffers(c, p, o, st),
        counts(o.count_comm ? *o.count_comm : c, p.num_groups, o.timeout) {
    const size_t nb = plan.buckets.size(), np = plan.param_bucket.size();
    local_active.assign(plan.num_groups, 0);
    seen.assign(np, 0);
    ready.assign(np, 0);
    pending.assign(nb, 0);
    launched.assign(nb, 0);
    keeper.assign(plan.num_groups, -1);
    kept.assign(nb, 0);
  }

  // All below run with `mu` held.
  void begin_sync() {
    counts.begin(local_active, comm.rank(), stats.step);
    synced = true;
    std::fill(ready.begin(), ready.end(), 0);
    for (const Bucket& b : plan.buckets) pending[b.index] = static_cast<int>(b.params.size());
  }

  // Builds the launch order once it is known. With prune off and average world it needs no
  // counts, so launching can start before the exchange lands.
  bool ensure_order(bool block) {
    if (order_ready) return true;
    const bool need_counts = opts.prune || opts.average == Average::contributors || any_keeper;
    if (need_counts && !counts.fetch(block)) return false;
    order.clear();
    for (const Bucket& b : plan.buckets) {
      kept[b.index] = any_keeper && kept_group(b.group) ? 1 : 0;
      if (!kept[b.index] && (!opts.prune || counts.counts()[b.group] > 0)) order.push_back(b.index);
    }
    order_ready = true;
    return true;
  }

  // The counts have landed: whether group g's one contributor is the rank that keeps it.
  bool kept_group(int g) const {
    const int k = keeper[static_cast<size_t>(g)];
    return k >= 0 && counts.counts()[static_cast<size_t>(g)] == 1 && counts.only_root(g) == k;
  }

  double divisor(int group) const {
    if (opts.average == Average::world) return comm.size();
    return std::max<int32_t>(1, counts.counts()[static_cast<size_t>(group)]);  // 0 only with prune off: zeros
  }

  // A kept bucket, at finish_backward: on its keeper, the gradient as a sent one would arrive
  // (unwritten parameters zeroed, divided), nothing elsewhere.
  void finish_kept(int b) {
    const Bucket& bucket = plan.buckets[static_cast<size_t>(b)];
    stats.buckets_kept += 1;
    stats.bytes_kept += static_cast<int64_t>(bucket.numel * dtype_size(opts.wire));
    if (keeper[static_cast<size_t>(bucket.group)] != comm.rank()) return;
    buffers.zero_unwritten(b, seen);
    const double d = divisor(bucket.group);
    if (d != 1.0) comm.divide(buffers.bucket_ptr(b), bucket.numel, d);
    buffers.mark_written(b);
  }

  bool bucket_ready(int b) const { return pending[b] == 0 || !local_active[plan.buckets[b].group]; }

  void launch(int b, Launches& out) {
    const Bucket& bucket = plan.buckets[b];
    AllreduceOptions o;
    o.op = ReduceOp::sum;
    o.divisor = divisor(bucket.group);
    o.tag = CollectiveTag{"allreduce", stats.step, b};
    o.bf16_wire = opts.wire == DType::bf16;
    // Only where the launch order waited for the counts: with prune off and average world a rank
    // may launch before its counts land and another after, and the two would start different
    // collectives (an allreduce and a broadcast) for the same bucket.
    const bool counts_agreed = opts.prune || opts.average == Average::contributors;
    if (counts_agreed && counts.ready() && opts.broadcast_min_ranks > 0 &&
        comm.size() >= opts.broadcast_min_ranks && counts.only_root(bucket.group) >= 0) {
      o.from_root = counts.only_root(bucket.group);
      stats.buckets_broadcast += 1;
    }
    const bool adopted = buffers.adopted(bucket.group);
    float* data = adopted ? nullptr : buffers.bucket_ptr(b);
    if (adopted) {  // a world of one: its gradients are final; zeros where some rank used the group but none came
      if (!counts.ready() || counts.counts()[bucket.group] > 0)
        for (int p : bucket.params) buffers.adopted_grad(p, /*zeros_if_none=*/true);
    } else if (o.from_root < 0 || o.from_root == comm.rank()) {
      buffers.zero_unwritten(b, seen);  // else overwritten
    }
    const auto t0 = Clock::now();
    works.push_back(adopted ? comm.after_compute(o.tag) : comm.allreduce(data, bucket.numel, DType::f32, o));
    const auto t1 = Clock::now();
    stats.launch_call_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
    counts.fetch(/*block=*/false);  // prune off, average world: maybe not fetched yet
    Launched l{b, counts.ready() ? counts.counts()[bucket.group] : -1, works.back(), data, nullptr};
    if (buffers.streamed(bucket.group)) l.keep = buffers.hold_until_done(b, works.back());
    out.push_back(std::move(l));
    launched[b] = 1;
    buffers.mark_written(b);
    stats.buckets_launched += 1;
    const auto bytes = static_cast<int64_t>(bucket.numel * dtype_size(opts.wire));
    stats.bytes_allreduced += bytes;
    if (!adopted && comm.size() > 1) timer.launched(works.back(), bytes, o.from_root >= 0);
    if (!local_active[bucket.group]) stats.buckets_zero_filled += 1;
  }

  // Launches every bucket of the order not yet launched (paced: see run), with the time it took
  // to learn the order and to launch them in the window's stats.
  void launch_rest(Launches& out, bool paced) {
    if (!synced) begin_sync();  // a window without begin_sync: exchange now
    const auto t0 = Clock::now();
    ensure_order(true);
    const auto t1 = Clock::now();
    const size_t before = out.size();
    run(true, out, paced);
    stats.finish_order_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
    stats.finish_launch_ms += std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
    stats.finish_launched += static_cast<int>(out.size() - before);
  }

  // Whether a collective of this window may still write into the engine's memory.
  bool in_flight() const {
    if (counts.in_flight()) return true;
    for (const auto& w : works)
      if (!w->is_completed()) return true;
    return false;
  }

  // Launches ready buckets in order; `all` launches every remaining one (finish_backward).
  // Paced (the calls that hand launches back, where the host waits for them: no wait stream),
  // a call stops after one streamed bucket: its caller waits for it and consumes it, so its memory
  // is free again before the next one's is taken (Engine::launch_ready pulls the rest); memory
  // for streamed groups then follows one bucket in flight, not a burst of them.
  void run(bool all, Launches& out, bool paced) {
    if (!ensure_order(all)) return;
    paced = paced && !opts.wait_stream;
    while (next < order.size()) {
      const int b = order[next];
      if (!all && !bucket_ready(b)) break;
      launch(b, out);
      ++next;
      if (paced && buffers.streamed(plan.buckets[static_cast<size_t>(b)].group)) break;
    }
  }
};

}  // namespace thetad::comm
