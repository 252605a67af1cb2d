// Who holds a group's current values (docs/architecture.md, same title): the rule that decides,
// per (group, optimizer window), whether a resident group trained by one rank alone keeps its
// gradient on that rank (its replicas elsewhere go stale) or sends it as any other, and the
// record of which rank holds each stale group's state with the transfers that bring it where the
// schedule needs it. Torch-free and deterministic: every rank, and the single-process reference,
// computes the same decisions from the schedule alone.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "config/job.hpp"
#include "daemon/plan/window_plan.hpp"

namespace thetad::daemon {

// How one optimizer window touches one group.
struct GroupUse {
  int readers = 0;   // ranks whose forward reads it (StepPlan::used, over the window's micro-steps)
  int trainers = 0;  // of those, ranks that train it (StepPlan::trained)
  int sole = -1;     // the one reader, where readers == 1
};

// The cost model, in bytes per element of the group: what its gradient costs on the wire in one
// window, and what moving its state (values and optimizer moments) to another rank costs once.
struct ReplicaCosts {
  int64_t gradient = 4;  // comm.grad_dtype: 4 (fp32) or 2 (bf16)
  int64_t state = 12;    // fp32 values and Adam's two moments; values only for SGD (4)
};
ReplicaCosts replica_costs(const config::Job& job);
// The fewest windows a run must train the group in for keeping to cost less than sending:
// the smallest k with k * gradient > state (fp32 Adam: 4; bf16 Adam: 7).
int min_kept_run(const ReplicaCosts& costs);

enum class ReplicaMode {
  none,  // nobody trains the group in the window
  send,  // its gradient travels (reduced, or broadcast from its one trainer): every rank steps it
  keep,  // its one trainer keeps the gradient and alone steps it; the others' replicas go stale
};
struct ReplicaDecision {
  ReplicaMode mode = ReplicaMode::none;
  int keeper = -1;  // keep: the rank
  bool operator==(const ReplicaDecision& o) const { return mode == o.mode && keeper == o.keeper; }
};

// The rule, a pure function of the group's use in each window (`use(x)` for x >= 0). Window w's
// one reader u, who also trains the group, keeps it if the run of windows around w in which u is
// the group's only reader (windows that do not touch it do not break a run; at most `horizon`
// windows either side of w are looked at) trains it in at least `min_run` windows: sending costs
// the run min_run or more gradients, keeping costs one move of the state when the run ends
// (to the next user, or to every rank at a checkpoint or the end). Every window of a run gets the
// same answer (where the horizon does not cut it), whatever step the run is resumed at. Otherwise
// `send` where someone trains the group, `none` where nobody does.
ReplicaDecision decide_replica(const std::function<GroupUse(int64_t)>& use, int64_t window, int min_run,
                               int64_t horizon);

// The rule over a job's schedule: each window's uses read from the run's window plans (every
// rank's, computed once; the plans of kHorizon windows behind the current one are kept for it).
class ReplicaPlan {
 public:
  // How far either side of a window the rule looks (windows).
  static constexpr int64_t kHorizon = 1024;

  // `keepable` (per group): groups the rule may keep (Placement::replica_keepable); the others are sent.
  ReplicaPlan(WindowPlans& plans, std::vector<uint8_t> keepable, ReplicaCosts costs);

  // The rule's decision; `send` for a group it does not apply to (whoever trains it).
  ReplicaDecision decision(int64_t window, int group);
  // The window's use of a keepable group (nothing for the others).
  GroupUse use(int64_t window, int group);
  // The ranks that read a keepable group in the window, ascending.
  std::vector<int> readers(int64_t window, int group);
  int num_groups() const { return static_cast<int>(keepable_.size()); }

 private:
  // Every rank's plan of window w: the last window asked for is kept at hand, since a window's
  // decisions ask it once per group.
  const std::vector<std::shared_ptr<const WindowPlan>>& ranks(int64_t w);

  WindowPlans& plans_;
  const std::vector<uint8_t> keepable_;
  const int min_run_;
  int64_t ranks_window_ = -1;
  std::vector<std::shared_ptr<const WindowPlan>> ranks_;
};


// A move of one group's state (values and moments) from the rank that holds it.
struct StateMove {
  int group = -1;
  int from = -1;  // the holder
  int to = -1;    // the one rank that needs it (point-to-point), or -1: every rank (a broadcast)
  bool operator==(const StateMove& o) const { return group == o.group && from == o.from && to == o.to; }
};

// Which rank holds each group's current state: the same record on every rank, since it follows
// the decisions and the engine's agreed counts only. All current at the start (fresh or resumed).
// A point-to-point move when exactly one rank needs the state (the next user: one link, two
// ranks, nobody else waits); a broadcast when every rank needs it (the group's gradient is sent,
// so every rank steps it; several readers; a checkpoint, the final hash, an export).
class ReplicaHolders {
 public:
  explicit ReplicaHolders(int num_groups) : holder_(static_cast<size_t>(num_groups), -1) {}
  // -1: every rank's replica is current; else the one rank whose replica is.
  int holder(int g) const { return holder_[static_cast<size_t>(g)]; }
  // Before the window decided `d` for group g, read by `readers`: the move that makes the state
  // current where the window needs it (every rank if the gradient is sent, else each reader).
  std::optional<StateMove> before(int g, const ReplicaDecision& d, const std::vector<int>& readers);
  // Before the group's update, once the engine agreed who kept its gradient (`kept_by`, -1: it was
  // sent): a broadcast if it was sent while some replica is stale (the decision said keep, the
  // counts said otherwise); then the record follows the update.
  std::optional<StateMove> before_update(int g, int kept_by);
  // The broadcasts that make every replica current (the record is then all current).
  std::vector<StateMove> make_all_current();

 private:
  std::vector<int> holder_;
};

}  // namespace thetad::daemon
