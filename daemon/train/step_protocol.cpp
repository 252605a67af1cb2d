// StepProtocol (see step_protocol.hpp): the order of a step's calls, and nothing else.
#include "daemon/train/step_protocol.hpp"

#include <vector>

namespace thetad::daemon {

StepProtocol::StepProtocol(comm::Engine& engine, GradHooks& hooks, Homes& homes, WindowPlans& plans, bool declared,
                           int rank)
    : engine_(engine), hooks_(hooks), homes_(homes), plans_(plans), declared_(declared), rank_(rank) {}

std::shared_ptr<const WindowPlan> StepProtocol::open_window(int64_t step, const AdamSettings& settings) {
  plans_.advance(step);
  std::shared_ptr<const WindowPlan> window = plans_.at(step, rank_);
  engine_.start_window(step);
  hooks_.start_window();
  homes_.start_window(*window, settings);
  return window;
}

StepPlan StepProtocol::start_micro(const WindowPlan& window, int64_t m) {
  StepPlan plan = window.step_plan(m);
  hooks_.set_trained(plan.trained);
  homes_.start_micro(plan);
  if (declared_) engine_.declare_active(plan.trained);
  return plan;
}

void StepProtocol::before_forward(bool final) {
  if (declared_ && final) engine_.begin_sync();
}

void StepProtocol::after_forward(const torch::Tensor& loss, bool final) {
  if (declared_) return;
  std::vector<uint8_t> found = hooks_.discover_groups(loss);
  homes_.add_reached(found);  // streamed Θ has no leaves in the graph
  engine_.declare_active(found);
  if (final) engine_.begin_sync();
}

void StepProtocol::backward(bool final, const StepPlan& plan, const std::function<void()>& run) {
  homes_.before_backward(final, plan);
  run();
  hooks_.rethrow_error();
  homes_.after_backward(final);
}

void StepProtocol::finish_reduce() {
  for (comm::Launches rest = engine_.launch_rest(); !rest.empty(); rest = engine_.launch_rest()) homes_.take(rest);
  homes_.take(engine_.finish_backward());
}

void StepProtocol::end_window() {
  homes_.after_reduce();
  hooks_.end_window();
}

void StepProtocol::step(const AdamSettings& settings, bool skip, int64_t step) {
  homes_.step(engine_.contributors(), settings, skip);
  homes_.release_step(step);
}

}  // namespace thetad::daemon
