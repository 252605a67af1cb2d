// Where a parameter group lives, as one type. A home holds its groups' values, gradients' memory
// mode and optimizer state (the device: ResidentHome; the host store with its slots, cache and
// transit lines: StoreHome; Θ streamed layer by layer: StreamedTrunk) and answers for them at
// every point of a step, of a checkpoint and of the final hash. The table of which group lives
// where (Homes) is built once at set-up; the trainer and the run state only loop over it.
//
// Adding a home (say, NVMe): implement this interface in daemon/homes/, name its kind in the
// placement (daemon/plan/placement: which groups go there, and its memory terms in the estimates)
// and build it for that kind in Homes' constructor (homes.cpp); nothing in train/ or state/ changes.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/bucket_plan.hpp"
#include "comm/engine.hpp"
#include "common/errors.hpp"
#include "daemon/observe/metrics.hpp"
#include "daemon/plan/window_plan.hpp"
#include "daemon/models/param_groups.hpp"
#include "daemon/optim/optimizer.hpp"

namespace thetad::offload {
class Device;
}

namespace thetad::daemon {

// A home's device memory by what it holds (bytes).
struct HomeMemory {
  int64_t params = 0;     // its groups' values in the caching allocator (the model's tensors)
  int64_t optimizer = 0;  // Adam moments in the caching allocator
  int64_t lines = 0;      // slots, cache and transit lines: memory of its own, outside the allocator
};

// What set-up hands each home in turn (Homes::build): the engine, the run's window plans (which a
// home may read ahead in: the store's look-ahead), this rank, where the buckets its own calls into
// the engine launch go, and what a home built earlier offers the later ones.
struct HomeSetup {
  comm::Engine& engine;
  WindowPlans& plans;
  int rank = 0;
  // The buckets launched by a home's own calls into the engine (a gradient handed over): each
  // goes to its group's home, which may be another one (Homes::take).
  comm::LaunchHandler take_launches;
  // The copy device (H2D and D2H streams) of a host store built earlier: a later store shares it,
  // so that both copy on the same streams (null: none yet).
  offload::Device* copy_device = nullptr;
};

// What every home may use of the current window.
struct WindowSettings {
  AdamSettings adam;                   // the step's settings (its step count: per group, below)
  const std::vector<int64_t>* group_steps = nullptr;  // optimizer steps each group has taken
  bool update_known = false;           // nothing after backward can change the update (no
                                       // skip_step, no clipping): homes may step as buckets land
  AdamSettings for_group(int g) const {  // the settings of group g's next step
    AdamSettings s = adam;
    s.step = (*group_steps)[static_cast<size_t>(g)] + 1;
    return s;
  }
};

class GroupHome {
 public:
  virtual ~GroupHome() = default;
  virtual const char* kind() const = 0;  // "resident", "host store", "streamed trunk"

  // ---- set-up, in this order (Homes) ----
  // Before the bucket plan: engine parameters of its own (a row-sharded group's shards),
  // appended to `infos`, whose entries of its groups it may change.
  virtual void plan_params(std::vector<comm::ParamInfo>& infos) { (void)infos; }
  // The engine's gradient memory for group g (GradMemory::none: never a gradient).
  virtual comm::GradMemory grad_memory(int g) const = 0;
  virtual void engine_options(comm::EngineOptions& o) { (void)o; }
  // Once the engine exists (the host stores are built here: collective over the host's ranks).
  virtual void build(HomeSetup& setup) = 0;

  // ---- a window (one optimizer step of accumulate_steps micro-steps) ----
  // `plan`: this rank's plan of the window (its step, micro-steps, used and trained groups).
  virtual void start_window(const WindowPlan& plan, const WindowSettings& w) {
    (void)plan;
    (void)w;
  }
  virtual void start_micro(const StepPlan& plan) { (void)plan; }
  // comm.active: discover: groups this micro-step's forward reached without leaves in the graph.
  virtual void add_reached(std::vector<uint8_t>& found) const { (void)found; }
  virtual void before_backward(bool last, const StepPlan& plan) {
    (void)last;
    (void)plan;
  }
  virtual void after_backward(bool last) { (void)last; }
  // After finish_backward (every bucket reduced, the compute stream ordered after them).
  virtual void after_reduce() {}
  // The engine launched bucket `l.bucket` of one of its groups (Launched: its work, the ranks
  // that used the group, its reduced values at `data` once the work completes). Called outside
  // the engine's lock, maybe on autograd's device thread, one launch at a time: it may ask the
  // engine, but must not hand it gradients (that would launch again from inside Homes::take).
  virtual void on_bucket_launch(const comm::Launched& l) = 0;

  // ---- the optimizer (every rank, each group some rank used; lazy: others are skipped) ----
  virtual void step(int g, const AdamSettings& s) = 0;
  virtual void skip(int g) { (void)g; }
  virtual void release_step(int64_t step) { (void)step; }

  // ---- state: checkpoints, resume, the final hash ----
  // Every rank's copy of its groups current (collective: every rank calls it at the same point),
  // before anything reads them for a file, a hash or an export: a home whose groups may be
  // current on one rank only (ResidentHome's replicas) brings them to the others.
  virtual void make_current() {}
  // Tensors in the group's parameter order; `initial` where the group was never held.
  virtual GroupState state(int g) = 0;
  virtual void restore(int g, const GroupState& st) = 0;
  // Its values and moments live on the device (a checkpoint's snapshot stages them there).
  virtual bool on_device(int g) const = 0;
  // Parameter p's values on the host, readable in place (nullptr: read the model's tensor).
  virtual const float* host_values(int p) {
    (void)p;
    return nullptr;
  }
  // Not held at all (offload.host_groups: scheduled): at its initial values, drawn on demand.
  virtual bool initial(int g) const {
    (void)g;
    return false;
  }
  virtual void initial_values(int p, float* dst) const {
    (void)dst;
    throw InternalError("parameter " + std::to_string(p) + " has no initial values to draw in its home");
  }

  // ---- a forward outside any step (evaluation) ----
  // Points group g's parameters at its current values on the device the model computes on, for
  // a forward without gradient between steps; the function returned puts them back. A home whose
  // parameters always hold their current values there (resident) lends nothing: empty.
  virtual std::function<void()> lend_to_forward(int g) {
    (void)g;
    return {};
  }

  // ---- memory and metrics ----
  virtual HomeMemory device_memory() const { return {}; }
  virtual void add_stats(StepRecord& rec) { (void)rec; }

  // The groups this home holds, ascending (Homes sets them once, before set-up).
  void hold(std::vector<int> groups) { held_ = std::move(groups); }
  const std::vector<int>& held() const { return held_; }

 private:
  std::vector<int> held_;
};

}  // namespace thetad::daemon
