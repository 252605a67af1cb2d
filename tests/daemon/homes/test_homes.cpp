// The group -> home table as the trainer uses it, and a fourth home plugged in: a test-only home
// that keeps one task group's values and Adam moments in host vectors and steps them with the CPU
// AdamW. Driven through Homes alone (what train/ and state/ call), a few steps of a multitask
// MLP give the same bits with the group there as with every group resident: a new home needs
// nothing outside daemon/homes/ and the table.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <memory>
#include <vector>

#include "comm/bootstrap.hpp"
#include "comm/engine.hpp"
#include "config/loader.hpp"
#include "daemon/plan/job_options.hpp"
#include "daemon/plan/schedule.hpp"
#include "daemon/plan/window_plan.hpp"
#include "daemon/homes/homes.hpp"
#include "daemon/reducer/grad_hooks.hpp"
#include "daemon/train/step_protocol.hpp"

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
  void build(HomeSetup& setup) override {
    engine_ = &setup.engine;
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
  void start_window(const WindowPlan& plan, const WindowSettings& w) override {
    (void)plan;
    (void)w;
    for (int g : held())  // pooled: bound per window (here every window, used or not)
      for (int p : groups_.members[static_cast<size_t>(g)])
        groups_[p].tensor.mutable_grad() = torch::from_blob(engine_->grad(p), groups_[p].tensor.sizes(), torch::kFloat32);
  }
  void on_bucket_launch(const comm::Launched& l) override {
    (void)l;
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

// What a run asked of the schedule: (step, rank) compositions drawn at set-up and in each step.
struct ScheduleAsks {
  int64_t setup = 0;
  std::vector<int64_t> per_step;
  int64_t total = 0;    // over the run
  int64_t windows = 0;  // (window, rank) plans computed over the run
};

// Every parameter's values after the job's steps, read through the homes; `test_home`: task 1's
// group (group 2) lives in a HostVectorHome.
std::vector<std::vector<float>> train(bool test_home, HostVectorHome** placed = nullptr, const char* job_text = kJob,
                                      ScheduleAsks* asks = nullptr) {
  static comm::MpiSession mpi;
  const config::Job job = config::load_job_from_string(job_text, "homes.yaml");
  auto ctrl = comm::make_mpi_communicator();
  DataPlane plane;
  plane.comm = ctrl;
  auto model = make_model(job, torch::kCPU);
  ParamGroups groups(model->params(), static_cast<int>(job.model.tasks) + 1);
  auto schedule = Schedule::create(job, 1);
  auto data = make_data(job, *model, torch::kCPU);
  Homes homes(job, Placement::of(job, 1), *model, groups, plane, nullptr);
  if (test_home) {
    auto home = std::make_unique<HostVectorHome>(groups);
    if (placed) *placed = home.get();
    homes.place(2, std::move(home));
  }
  comm::EngineOptions eopts = engine_options(job);
  homes.engine_options(eopts);
  comm::Engine engine(ctrl, comm::make_bucket_plan(homes.plan_params(), groups.num_groups(), bucket_plan_options(job)),
                      eopts);
  WindowPlans plans(*schedule, job.accumulate_steps);
  homes.build(engine, plans, 0);
  GradHooks hooks(groups, engine, plane, homes.grad_memory(), homes.launch_handler());
  // The trainer's protocol of a step (daemon/train/step_protocol.hpp), driven without the trainer.
  StepProtocol protocol(engine, hooks, homes, plans, /*declared=*/true, 0);
  if (asks) asks->setup = schedule->draws();
  for (int64_t step = 0; step < job.steps; ++step) {
    const int64_t drawn = schedule->draws();
    AdamSettings s;
    s.lr = job.optimizer.lr;
    s.weight_decay = job.optimizer.weight_decay;
    const auto window = protocol.open_window(step, s);  // built once, handed to every home
    const int64_t k = job.accumulate_steps;
    for (int64_t m = 0; m < k; ++m) {
      const bool last = m + 1 == k;
      const int64_t micro = step * k + m;
      const StepPlan plan = protocol.start_micro(*window, m);
      protocol.before_forward(last);
      torch::Tensor loss;
      for (size_t i = 0; i < plan.tasks.size(); ++i) {
        Batch b = data->batch(micro, 0, 1, plan.tasks[i], plan.task_rows[i]);
        torch::Tensor l = model->loss(b, plan.tasks[i], static_cast<uint64_t>(micro));
        loss = loss.defined() ? loss + l : l;
      }
      protocol.after_forward(loss, last);
      protocol.backward(last, plan, [&] { loss.backward(); });
    }
    protocol.finish_reduce();
    protocol.end_window();
    protocol.step(s, /*skip=*/false, step);
    if (asks) asks->per_step.push_back(schedule->draws() - drawn);
  }
  if (asks) {
    asks->total = schedule->draws();
    asks->windows = plans.computed();
  }
  std::vector<std::vector<float>> values;
  for (size_t i = 0; i < groups.size(); ++i) {
    const NamedParam& p = groups[static_cast<int>(i)];
    std::vector<float> v(static_cast<size_t>(p.tensor.numel()));
    const Homes::HostValues host = homes.values_on_host(static_cast<int>(i));  // wherever its home keeps it
    std::memcpy(v.data(), host.data, v.size() * sizeof(float));
    EXPECT_TRUE(homes.finite(static_cast<int>(i))) << p.name;
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

// The schedule is asked once per (window, rank) a run needs: the trainer's plan, the homes'
// bindings, the store's slots and prefetch and the device cache's placement all read one window
// plan. Over the run every plan computed was drawn once (its micro-steps), and once the store's
// look-ahead runs ahead of the steps, a step draws the one window that enters it. The look-ahead
// draws on a thread of its own: a draw it makes late is counted in the next step (draws 1 0 2 1
// where they were 1 1 1 1, about one run in seven here), so from the run's second half on the
// draws so far are the steps' windows, one more or one fewer.
TEST(Homes, TheScheduleIsAskedOncePerWindow) {
  const std::string resident = kJob;
  const std::string offloaded = resident + "offload: {enabled: true, device_slots: 2, prefetch: 1}\n";
  const std::string accumulated = offloaded + "accumulate_steps: 2\n";
  for (const auto& [text, micro] : {std::pair<std::string, int64_t>{resident, 1}, {offloaded, 1}, {accumulated, 2}}) {
    ScheduleAsks asks;
    train(false, nullptr, text.c_str(), &asks);
    ASSERT_GE(asks.per_step.size(), 2u);
    std::string counts;
    for (int64_t n : asks.per_step) counts += " " + std::to_string(n);
    std::printf("schedule draws: set-up %lld, per step%s (%lld micro-step(s) per window)\n",
                static_cast<long long>(asks.setup), counts.c_str(), static_cast<long long>(micro));
    const size_t half = asks.per_step.size() / 2;
    int64_t drawn = 0;
    for (size_t s = half; s < asks.per_step.size(); ++s) {
      drawn += asks.per_step[s];
      const int64_t windows = static_cast<int64_t>(s - half + 1) * micro;
      EXPECT_LE(std::abs(drawn - windows), micro) << "steps " << half << ".." << s << " of\n" << text;
    }
    EXPECT_EQ(asks.total, asks.windows * micro) << "each (window, rank) drawn once:\n" << text;
  }
}

}  // namespace
}  // namespace thetad::daemon
