// An engine (and a control-plane flag) torn down while its collectives are in flight, as when an
// error unwinds a step on every rank at once: the memory those collectives write into must stay
// allocated (freeing it under them corrupted the heap). A communicator whose collectives
// complete only when the test says so, and whose allocations count their frees, shows it.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/bucket_plan.hpp"
#include "comm/control_plane.hpp"
#include "comm/engine.hpp"

namespace thetad::comm {
namespace {

class HeldWork : public Work {
 public:
  bool is_completed() override { return done; }
  void wait(std::chrono::milliseconds) override { done = true; }
  bool done = false;
};

// One rank; collectives complete when completed() says so (or when waited for).
class HeldComm : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  MemoryKind memory_kind() const override { return MemoryKind::host; }
  const char* backend_name() const override { return "held"; }
  WorkPtr allreduce(void*, size_t, DType, const AllreduceOptions&) override { return track(); }
  WorkPtr broadcast(void*, size_t, DType, int, const CollectiveTag&) override { return track(); }
  WorkPtr allgather(const void*, void*, size_t, DType, const CollectiveTag&) override { return track(); }
  WorkPtr reduce_scatter(const void*, void*, size_t, DType, ReduceOp, const CollectiveTag&) override { return track(); }
  WorkPtr exchange(const std::vector<PeerOp>&, const CollectiveTag&) override { return track(); }
  WorkPtr barrier(const CollectiveTag&) override { return track(); }
  void abort(const std::string&) override {}
  std::shared_ptr<void> allocate(size_t bytes) override {
    ++allocated;
    void* p = std::calloc(1, bytes ? bytes : 1);
    return std::shared_ptr<void>(p, [this](void* q) {
      ++freed;
      std::free(q);
    });
  }
  void zero(void* ptr, size_t bytes) override { std::memset(ptr, 0, bytes); }
  void complete_all() {
    for (auto& w : works) w->done = true;
  }
  std::vector<std::shared_ptr<HeldWork>> works;
  std::atomic<int> allocated{0}, freed{0};

 private:
  WorkPtr track() {
    works.push_back(std::make_shared<HeldWork>());
    return works.back();
  }
};

BucketPlan two_group_plan() {
  return make_bucket_plan({{"trunk.w", 8, 0}, {"head.w", 4, 1}}, 2, {});
}

TEST(EngineTeardown, CollectivesInFlightKeepTheirMemory) {
  auto comm = std::make_shared<HeldComm>();
  {
    Engine engine(comm, two_group_plan(), {});
    engine.start_window(0);
    engine.declare_active({1, 1});
    engine.begin_sync();  // the count exchange is in flight; an error unwinds the step here
  }
  EXPECT_GT(comm->allocated.load(), 0);
  EXPECT_EQ(comm->freed.load(), 0) << "the engine freed memory that a collective in flight writes into";
}

TEST(EngineTeardown, AFinishedEngineFreesItsMemory) {
  auto comm = std::make_shared<HeldComm>();
  {
    Engine engine(comm, two_group_plan(), {});
    engine.start_window(0);
    engine.declare_active({1, 1});
    engine.begin_sync();
    (void)engine.mark_ready(0);
    (void)engine.mark_ready(1);
    (void)engine.finish_backward();  // waits for every collective (HeldWork::wait completes it)
  }
  EXPECT_EQ(comm->freed.load(), comm->allocated.load());
}

TEST(EngineTeardown, AStopFlagDestroyedInFlightLeavesThePlaneUsable) {
  auto comm = std::make_shared<HeldComm>();
  ControlPlane plane(comm);
  std::weak_ptr<HeldWork> work;
  {
    ControlPlane::AnyFlag flag = plane.post_any(true, {"stop flag"});
    work = comm->works.back();
  }  // destroyed in flight: its buffer is left allocated for the collective
  comm->complete_all();
  ControlPlane::AnyFlag done = plane.post_any(true, {"stop flag"});
  comm->complete_all();
  EXPECT_TRUE(done.get());
}

}  // namespace
}  // namespace thetad::comm
