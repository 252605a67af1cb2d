// The reducer's autograd hooks: a failure inside backward keeps its kind. A collective that
// fails while backward runs (here: a bucket's allreduce on a communicator that was aborted, as
// after a peer's death, waited for inside the hook as the host store's copy does on CPUs) must
// reach the program as a CommError (exit 3), not as a bad job (exit 2).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>

#include "comm/bootstrap.hpp"
#include "comm/engine.hpp"
#include "common/errors.hpp"
#include "daemon/models/param_groups.hpp"
#include "daemon/reducer/grad_hooks.hpp"

namespace thetad::daemon {
namespace {

TEST(GradHooks, ACollectiveThatFailsDuringBackwardIsACommunicationFailure) {
  static comm::MpiSession mpi;
  auto grads = comm::make_mpi_communicator();
  std::vector<NamedParam> params{{"trunk.w", torch::randn({4}).set_requires_grad(true), 0, nullptr},
                                 {"trunk.b", torch::randn({3}).set_requires_grad(true), 0, nullptr}};
  ParamGroups groups(params, 1);
  comm::EngineOptions o;
  o.timeout = std::chrono::seconds(5);
  o.count_comm = comm::make_mpi_communicator();  // the counts arrive; the bucket's allreduce fails
  comm::Engine engine(grads, comm::make_bucket_plan({{"trunk.w", 4, 0}, {"trunk.b", 3, 0}}, 1, {}), o);
  DataPlane plane;
  plane.comm = grads;
  // The hook waits for the buckets its mark_ready launched, as a host backend's home does.
  GradHooks hooks(groups, engine, plane, {comm::GradMemory::overwrite}, [](const comm::Launches& ls) {
    for (const comm::Launched& l : ls) l.work->wait(std::chrono::seconds(5));
  });

  grads->abort("a peer failed during backward");
  engine.start_window(0);
  hooks.start_window();
  engine.declare_active({1});
  engine.begin_sync();
  engine.contributors();  // the counts have landed, so the hook launches the bucket itself
  (params[0].tensor.sum() * 2 + params[1].tensor.sum()).backward();
  try {
    hooks.rethrow_error();
    FAIL() << "the failed allreduce was not reported";
  } catch (const thetad::CommError& e) {
    EXPECT_EQ(thetad::exit_code_for(e), thetad::kExitComm) << e.what();
  } catch (const std::exception& e) {
    FAIL() << "reported as another kind of error (exit " << thetad::exit_code_for(e) << "): " << e.what();
  }
  hooks.rethrow_error();  // reported once
}

}  // namespace
}  // namespace thetad::daemon
