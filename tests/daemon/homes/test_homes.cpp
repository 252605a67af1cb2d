// The group -> home table as the trainer uses it, and a fourth home plugged in: a test-only home
// that keeps one task group's values and Adam moments in host vectors and steps them with the CPU
// AdamW. Driven through Homes alone (what train/ and state/ call), a few steps of a multitask
// MLP give the same bits with the group there as with every group resident: a new home needs
// nothing outside daemon/homes/ and the table.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "comm/bootstrap.hpp"
#include "comm/engine.hpp"
#include "config/loader.hpp"
#include "daemon/plan/job_options.hpp"
#include "daemon/plan/schedule.hpp"
#include "daemon/homes/homes.hpp"
#include "daemon/reducer/grad_hooks.hpp"

namespace thetad::daemon {
namespace {

// One group's values and moments in host vectors; its tensors point at the values.
class HostVectorHome final : public GroupHome {
 public:
  explicit HostVectorHome(ParamGroups& groups) : groups_(groups) {}
  const char* kind() const override { return "host vectors (test)"; }
  comm::GradMemory grad_memory(int g) const override {
    (void)g;
    return comm::GradMemory::pooled;
  }
  void build(comm::Engine& engine, const Schedule& schedule, int rank) override {
    (void)schedule;
    (void)rank;
    engine_ = &engine;
    torch::NoGradGuard no_grad;
    for (int g : held()) {
      Flat& f = flat_[g];
      f.values.resize(static_cast<size_t>(groups_.numel(g)));
      f.m.assign(f.values.size(), 0.f);
      f.v.assign(f.values.size(), 0.f);
      for (int p : groups_.members[static_cast<size_t>(g)]) {
        auto& t = groups_[p].tensor;
        float* at = f.values.data() + groups_.offset[static_cast<size_t>(p)];
        std::memcpy(at, t.detach().contiguous().data_ptr<float>(), static_cast<size_t>(t.numel()) * sizeof(float));
        t.set_data(torch::from_blob(at, t.sizes(), torch::kFloat32));
      }
    }
  }
  void start_window(int64_t step, const WindowSettings& w) override {
    (void)step;
    (void)w;
    for (int g : held())  // pooled: bound per window (here every window, used or not)
      for (int p : groups_.members[static_cast<size_t>(g)])
        groups_[p].tensor.mutable_grad() = torch::from_blob(engine_->grad(p), groups_[p].tensor.sizes(), torch::kFloat32);
  }
  void on_bucket_launch(int b, int contributors, comm::Work& work, float* data) override {
    (void)b, (void)contributors, (void)work, (void)data;
    ++launches;
  }
  void step(int g, const AdamSettings& s) override {
    Flat& f = flat_.at(g);
    for (int p : groups_.members[static_cast<size_t>(g)]) {
      const size_t off = groups_.offset[static_cast<size_t>(p)];
      offload::adam_step(f.values.data() + off, engine_->grad(p), f.m.data() + off, f.v.data() + off,
                         static_cast<size_t>(groups_[p].tensor.numel()), to_hyper(s));
    }
    ++steps;
  }
  GroupState state(int g) override {
    GroupState st;
    st.group = g;
    return st;
  }
  void restore(int g, const GroupState& st) override { (void)g, (void)st; }
  bool on_device(int g) const override {
    (void)g;
    return false;
  }
  const float* host_values(int p) override {
    return flat_.at(groups_[p].group).values.data() + groups_.offset[static_cast<size_t>(p)];
  }
  int launches = 0, steps = 0;

 private:
  struct Flat {
    std::vector<float> values, m, v;
  };
  ParamGroups& groups_;
  comm::Engine* engine_ = nullptr;
  std::map<int, Flat> flat_;
};

const char* kJob =
    "job: homes\nseed: 5\nsteps: 6\n"
    "model: {kind: multitask_mlp, input_dim: 12, hidden: 16, trunk_layers: 2, head_layers: 2, tasks: 4}\n"
    "data: {kind: synthetic, batch_per_rank: 8, schedule: round_robin}\n"
    "comm: {backend: mpi, bucket_cap_mb: 0.0008, first_bucket_mb: 0.0004, timeout_s: 60}\n"
    "optimizer: {kind: adamw, lr: 0.01, weight_decay: 0.01}\n";

// Every parameter's values after the job's steps, read through the homes; `test_home`: task 1's
// group (group 2) lives in a HostVectorHome.
std::vector<std::vector<float>> train(bool test_home, HostVectorHome** placed = nullptr) {
  static comm::MpiSession mpi;
  const config::Job job = config::load_job_from_string(kJob, "homes.yaml");
  auto ctrl = comm::make_mpi_communicator();
  DataPlane plane;
  plane.comm = ctrl;
  auto model = make_model(job, torch::kCPU);
  ParamGroups groups(model->params(), static_cast<int>(job.model.tasks) + 1);
  auto schedule = Schedule::create(job, 1);
  auto data = make_data(job, *model, torch::kCPU);
  Homes homes(job, *model, groups, plane, nullptr);
  if (test_home) {
    auto home = std::make_unique<HostVectorHome>(groups);
    if (placed) *placed = home.get();
    homes.place(2, std::move(home));
  }
  comm::EngineOptions eopts = engine_options(job);
  homes.engine_options(eopts);
  comm::Engine engine(ctrl, comm::make_bucket_plan(homes.plan_params(), groups.num_groups(), bucket_plan_options(job)),
                      eopts);
  homes.build(engine, *schedule, 0);
  GradHooks hooks(groups, engine, plane, homes.grad_memory());
  for (int64_t step = 0; step < job.steps; ++step) {
    AdamSettings s;
    s.lr = job.optimizer.lr;
    s.weight_decay = job.optimizer.weight_decay;
    engine.start_window(step);
    hooks.start_window();
    homes.start_window(step, s);
    const StepPlan plan = schedule->plan(step, 0);
    hooks.set_trained(plan.trained);
    homes.start_micro(plan);
    engine.declare_active(plan.trained);
    engine.begin_sync();
    torch::Tensor loss;
    for (size_t i = 0; i < plan.tasks.size(); ++i) {
      Batch b = data->batch(step, 0, 1, plan.tasks[i], plan.task_rows[i]);
      torch::Tensor l = model->loss(b, plan.tasks[i], static_cast<uint64_t>(step));
      loss = loss.defined() ? loss + l : l;
    }
    homes.before_backward(true, plan);
    loss.backward();
    hooks.rethrow_error();
    homes.after_backward(true);
    engine.finish_backward();
    homes.after_reduce();
    hooks.end_window();
    homes.step(engine.contributors(), s, /*skip=*/false);
    homes.release_step(step);
  }
  std::vector<std::vector<float>> values;
  for (size_t i = 0; i < groups.size(); ++i) {
    const NamedParam& p = groups[static_cast<int>(i)];
    std::vector<float> v(static_cast<size_t>(p.tensor.numel()));
    if (const float* host = homes.of(p.group).host_values(static_cast<int>(i)))
      std::memcpy(v.data(), host, v.size() * sizeof(float));
    else
      std::memcpy(v.data(), p.tensor.detach().contiguous().data_ptr<float>(), v.size() * sizeof(float));
    values.push_back(std::move(v));
  }
  return values;
}

TEST(Homes, ATestOnlyHomeGivesTheResidentBits) {
  const auto resident = train(false);
  HostVectorHome* home = nullptr;
  const auto mixed = train(true, &home);
  ASSERT_EQ(resident.size(), mixed.size());
  for (size_t i = 0; i < resident.size(); ++i)
    EXPECT_EQ(std::memcmp(resident[i].data(), mixed[i].data(), resident[i].size() * sizeof(float)), 0)
        << "parameter " << i;
  ASSERT_NE(home, nullptr);
  // round_robin over 4 tasks, 6 steps: task 1 is in steps 1 and 5; its buckets went to its home.
  EXPECT_EQ(home->steps, 2);
  EXPECT_GT(home->launches, 0);
}

}  // namespace
}  // namespace thetad::daemon
