// The replica rule and its record (see replica_plan.hpp).
#include "daemon/plan/replica_plan.hpp"

#include <algorithm>

#include "common/errors.hpp"

namespace thetad::daemon {

ReplicaCosts replica_costs(const config::Job& job) {
  ReplicaCosts c;
  c.gradient = job.comm.grad_dtype == config::GradDtype::Bf16 ? 2 : 4;
  c.state = job.optimizer.kind == config::OptimizerKind::Sgd ? 4 : 12;
  return c;
}

int min_kept_run(const ReplicaCosts& costs) {
  THETAD_CHECK(costs.gradient > 0 && costs.state >= 0, InternalError, "replica costs ", costs.gradient, ", ",
               costs.state);
  return static_cast<int>(costs.state / costs.gradient + 1);
}

ReplicaDecision decide_replica(const std::function<GroupUse(int64_t)>& use, int64_t window, int min_run,
                               int64_t horizon) {
  const GroupUse here = use(window);
  if (here.trainers == 0) return {ReplicaMode::none, -1};
  if (here.readers != 1 || here.trainers != 1) return {ReplicaMode::send, -1};
  const int user = here.sole;
  int trained = 1;
  // Counts the run's trained windows on one side of `window`, until another rank touches the
  // group, the horizon, step 0, or enough.
  const auto scan = [&](int64_t dir) {
    for (int64_t n = 1; n <= horizon && trained < min_run; ++n) {
      const int64_t x = window + dir * n;
      if (x < 0) return;
      const GroupUse u = use(x);
      if (u.readers == 0) continue;
      if (u.readers != 1 || u.sole != user) return;
      trained += u.trainers;
    }
  };
  scan(-1);
  scan(+1);
  if (trained >= min_run) return {ReplicaMode::keep, user};
  return {ReplicaMode::send, -1};
}

ReplicaPlan::ReplicaPlan(WindowPlans& plans, std::vector<uint8_t> keepable, ReplicaCosts costs)
    : plans_(plans), keepable_(std::move(keepable)), min_run_(min_kept_run(costs)) {
  THETAD_CHECK(static_cast<int>(keepable_.size()) == plans_.num_groups(), InternalError, "ReplicaPlan: ",
               keepable_.size(), " keepable flags for ", plans_.num_groups(), " groups");
  plans_.keep_behind(kHorizon);  // the scan around a window reads back as far
}

const std::vector<std::shared_ptr<const WindowPlan>>& ReplicaPlan::ranks(int64_t w) {
  if (w != ranks_window_) {
    ranks_ = plans_.all_ranks(w);
    ranks_window_ = w;
  }
  return ranks_;
}

// Window w's use of a keepable group: the ranks whose window plans read it, and of those, the
// ones that train it (a group counted once per rank).
GroupUse ReplicaPlan::use(int64_t w, int group) {
  GroupUse u;
  if (!keepable_[static_cast<size_t>(group)]) return u;
  for (const auto& p : ranks(w)) {
    if (!p->reads(group)) continue;
    u.readers += 1;
    u.trainers += p->trains(group) ? 1 : 0;
    u.sole = p->rank;
  }
  if (u.readers != 1) u.sole = -1;
  return u;
}

std::vector<int> ReplicaPlan::readers(int64_t w, int group) {
  std::vector<int> reading;
  if (!keepable_[static_cast<size_t>(group)]) return reading;
  for (const auto& p : ranks(w))
    if (p->reads(group)) reading.push_back(p->rank);
  return reading;
}

ReplicaDecision ReplicaPlan::decision(int64_t w, int group) {
  THETAD_CHECK(w >= 0 && group >= 0 && group < num_groups(), InternalError, "ReplicaPlan: window ", w, ", group ",
               group);
  // The scan around w needs no window before w - kHorizon: those go (the loop moves forward).
  plans_.advance(w);
  if (!keepable_[static_cast<size_t>(group)]) return {ReplicaMode::send, -1};
  return decide_replica([&](int64_t x) { return use(x, group); }, w, min_run_, kHorizon);
}

std::optional<StateMove> ReplicaHolders::before(int g, const ReplicaDecision& d, const std::vector<int>& readers) {
  int& h = holder_[static_cast<size_t>(g)];
  if (h < 0) return std::nullopt;
  const int from = h;
  if (d.mode == ReplicaMode::send) {
    h = -1;
    return StateMove{g, from, -1};
  }
  std::vector<int> need;
  for (int r : readers)
    if (r != from) need.push_back(r);
  if (d.mode == ReplicaMode::keep && d.keeper != from &&
      std::find(need.begin(), need.end(), d.keeper) == need.end())
    need.push_back(d.keeper);
  if (need.empty()) return std::nullopt;
  if (need.size() > 1) {
    h = -1;
    return StateMove{g, from, -1};
  }
  // The next user: after its window it alone holds the update (a reader that only reads keeps the
  // holder as it was, whose replica stays current as well).
  if (d.mode == ReplicaMode::keep) h = need[0];
  return StateMove{g, from, need[0]};
}

std::optional<StateMove> ReplicaHolders::before_update(int g, int kept_by) {
  int& h = holder_[static_cast<size_t>(g)];
  const int from = h;
  std::optional<StateMove> move;
  if (kept_by < 0 && from >= 0) move = StateMove{g, from, -1};
  else if (kept_by >= 0 && from >= 0 && from != kept_by) move = StateMove{g, from, kept_by};
  h = kept_by;
  return move;
}

std::vector<StateMove> ReplicaHolders::make_all_current() {
  std::vector<StateMove> moves;
  for (size_t g = 0; g < holder_.size(); ++g) {
    if (holder_[g] < 0) continue;
    moves.push_back({static_cast<int>(g), holder_[g], -1});
    holder_[g] = -1;
  }
  return moves;
}

}  // namespace thetad::daemon
