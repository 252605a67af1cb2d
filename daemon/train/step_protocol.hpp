// One optimizer step's protocol over the engine, the gradient hooks and the homes, in one place:
// which of them hears what, in which order, for a window of micro-steps and the passes in each.
// The trainer (trainer_step.cpp) times and records around these calls; the homes' test drives a
// step through the same object, so the order the homes see is written once.
//
//   const auto window = protocol.open_window(step, settings);   // plans, engine, hooks, homes
//   for each micro-step m:
//     const StepPlan plan = protocol.start_micro(*window, m);  // hooks, homes, engine (declared)
//     for each pass (one, or one per task):
//       protocol.before_forward(final);                        // the count exchange overlaps forward
//       loss = forward(...);
//       protocol.after_forward(loss, final);                   // groups discovered from the graph
//       protocol.backward(final, plan, [&] { loss.backward(); });
//   protocol.finish_reduce();                                  // the last buckets (once, after the final pass)
//   protocol.end_window();                                     // homes, hooks
//   protocol.step(settings, skip, step);                       // each used group in its home
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "comm/engine.hpp"
#include "daemon/homes/homes.hpp"
#include "daemon/plan/window_plan.hpp"
#include "daemon/reducer/grad_hooks.hpp"

namespace thetad::daemon {

class StepProtocol {
 public:
  // `declared`: comm.active declared (each micro-step's groups from the plan); otherwise they
  // are discovered from each pass's graph before its backward.
  StepProtocol(comm::Engine& engine, GradHooks& hooks, Homes& homes, WindowPlans& plans, bool declared, int rank);

  // Step `step`'s window: the plans advanced to it, then the engine, the hooks and every home
  // opened on this rank's plan (built once, handed to all).
  std::shared_ptr<const WindowPlan> open_window(int64_t step, const AdamSettings& settings);
  // Micro-step m of the window: its plan, its trained groups told to the hooks, the homes and
  // (declared) the engine.
  StepPlan start_micro(const WindowPlan& window, int64_t m);
  // Before the forward of a pass; `final`: the window's last pass, whose count exchange starts
  // here (declared) to overlap its forward.
  void before_forward(bool final);
  // After the forward of a pass: where groups are discovered, the graph's groups declared (and
  // for the final pass, the count exchange started), still before backward.
  void after_forward(const torch::Tensor& loss, bool final);
  // The pass's backward (`run`: autograd, or a graph's replay) between the homes' two phases;
  // an error a hook met is rethrown here.
  void backward(bool final, const StepPlan& plan, const std::function<void()>& run);
  // After the final pass's backward: the engine launches what is left and the compute stream
  // waits for the last buckets; the buckets it launched go to their homes.
  void finish_reduce();
  // The reduced window closed: the homes' after-reduce phase, then the hooks'.
  void end_window();
  // The optimizer: each group some rank used stepped in its home (none where `skip`), then the
  // homes release what the step held.
  void step(const AdamSettings& settings, bool skip, int64_t step);

 private:
  comm::Engine& engine_;
  GradHooks& hooks_;
  Homes& homes_;
  WindowPlans& plans_;
  const bool declared_;
  const int rank_;
};

}  // namespace thetad::daemon
