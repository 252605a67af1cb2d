// The worker's one device AdamW: every home steps the groups whose optimizer state is on the
// device through it (resident groups; θ[t] in device-cache or transit lines; Θ's device layers).
// A step runs on the compute stream, clipped by its operands' joint norm; with optimizer.overlap
// on GPUs a bucket's step may instead be queued on a side stream once its allreduce has landed,
// and join() orders the compute stream after those.
#pragma once

#include <functional>
#include <memory>

#include "comm/engine.hpp"
#include "config/job.hpp"
#include "daemon/device/data_plane.hpp"
#include "daemon/optim/optimizer.hpp"

namespace thetad::daemon {

class DeviceAdam {
 public:
  DeviceAdam(const DataPlane& plane, const config::OptimizerConfig& opt);
  ~DeviceAdam();
  DeviceAdam(const DeviceAdam&) = delete;
  DeviceAdam& operator=(const DeviceAdam&) = delete;

  // optimizer.overlap takes effect: buckets may be stepped as they land (GPUs only; not when
  // clipping needs the whole group's norm first).
  static bool overlaps(const DataPlane& plane, const config::OptimizerConfig& opt);
  bool overlap() const { return overlap_; }

  // Steps `ops` now, on the compute stream (ordered after the engine's reductions), scaled by
  // clipping their joint gradient norm to `clip_norm` (<= 0: no clipping).
  void step(AdamOperands& ops, AdamSettings s, double clip_norm) const;
  // overlap: queues a step on the side stream after `work` (its bucket's allreduce), of the
  // operands `gather` collects there (so that moments it creates are ordered before their use);
  // no clipping (overlap is off with clip_norm). May run on autograd's device thread.
  void step_after(comm::Work& work, const AdamSettings& s, const std::function<void(AdamOperands&)>& gather);
  // Before the rest of the step's updates: the compute stream waits for the side stream's steps.
  void join();

 private:
  const DataPlane& plane_;
  const bool overlap_;
  struct SideStream;
  std::unique_ptr<SideStream> side_;
};

}  // namespace thetad::daemon
