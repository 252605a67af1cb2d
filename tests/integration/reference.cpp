// The single-process reference of the equivalence tests: it plays all W ranks of a job in one
// process with plain autograd (no engine, no MPI), applies the math the engine promises (per
// group, the sum of the contributing ranks' gradients divided by the contributor count or by W;
// with comm.grad_dtype bf16 rounded as the wire rounds it, except a group the replica rule kept
// on its one trainer, whose gradient never travels), steps the same optimizer, and compares the
// result with a checkpoint written by a real multi-rank `thetad run`.
//
//   thetad_reference JOB.yaml --world W [--set k=v ...] --compare CKPT_DIR [--tol 1e-6]
//   thetad_reference --cases LIST
// With --cases, each line of LIST is `NAME JOB.yaml --world W ...` (words split at blanks), all
// compared in one process (one LibTorch start for a test's many runs); one line per case on
// stdout, `NAME ok: ...` or `NAME FAIL: ...`; exit 0 when every case matched.
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "config/loader.hpp"
#include "daemon/plan/input_path.hpp"
#include "daemon/plan/job_options.hpp"
#include "daemon/plan/placement.hpp"
#include "daemon/plan/replica_plan.hpp"
#include "daemon/plan/schedule.hpp"
#include "daemon/models/model.hpp"
#include "daemon/ops/precision.hpp"
#include "daemon/optim/optimizer.hpp"
#include "daemon/state/checkpoint.hpp"

using namespace thetad;
using namespace thetad::daemon;

// What a bf16 wire delivers (AllreduceOptions::wire): each share times float(1/div) rounded to
// bf16, summed in rank order with every addition rounded to bf16. Exact for 2 ranks (one
// commutative addition); for more, MPI's order may differ within bf16 rounding.
torch::Tensor bf16_wire_sum(const std::vector<torch::Tensor>& shares, const torch::Tensor& like, double div) {
  const auto bf16 = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kFloat32); };
  const float factor = static_cast<float>(1.0 / div);
  torch::Tensor acc = torch::zeros_like(like);
  for (const torch::Tensor& g : shares) acc = bf16(acc + bf16(g * factor));
  return acc;
}

// One comparison: the reference run of the job in `args` against its --compare checkpoint. Its
// verdict goes to `out` (and details of a failure to `err`); 0 when it matched, else 1.
int compare(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string job_path, compare_dir;
  int world = 1;
  double tol = 1e-6;
  config::LoadOptions lo;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool has_value = i + 1 < args.size();
    if (a == "--world" && has_value) world = std::stoi(args[++i]);
    else if (a == "--set" && has_value) lo.overrides.push_back(args[++i]);
    else if (a == "--compare" && has_value) compare_dir = args[++i];
    else if (a == "--tol" && has_value) tol = std::stod(args[++i]);
    else job_path = a;
  }
  try {
    config::Job job = config::load_job(job_path, lo);
    auto schedule = Schedule::create(job, world);
    WindowPlans windows(*schedule, job.accumulate_steps);
    ReplicaPlan replicas(windows, Placement::of(job, world).replica_keepable, replica_costs(job));
    torch::Device cpu(torch::kCPU);
    const config::Job inputs = with_input_paths(job, 0);  // as rank 0 reads them
    auto model = make_model(inputs, cpu);
    auto data = make_data(inputs, *model, cpu);
    auto& params = model->params();
    const int G = static_cast<int>(job.model.tasks) + 1;
    std::vector<std::vector<int>> group_params(G);
    std::vector<torch::Tensor> m, v, sum;
    // comm.grad_dtype bf16: each contributor's gradient, to round its share as the wire does.
    const bool bf16_wire = job.comm.grad_dtype == config::GradDtype::Bf16;
    std::vector<std::vector<torch::Tensor>> shares(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      group_params[params[i].group].push_back(static_cast<int>(i));
      m.push_back(torch::zeros_like(params[i].tensor).detach());
      v.push_back(torch::zeros_like(params[i].tensor).detach());
      sum.push_back(torch::zeros_like(params[i].tensor).detach());
    }
    std::vector<int64_t> group_steps(G, 0);
    const bool discover = job.comm.active == config::Active::Discover;
    for (int64_t step = 0; step < job.steps; ++step) {
      std::vector<int> contributors(G, 0);
      for (auto& s : sum) s.zero_();
      for (auto& s : shares) s.clear();
      const int64_t k = job.accumulate_steps;
      for (int r = 0; r < world; ++r) {
        for (auto& p : params) p.tensor.mutable_grad() = torch::Tensor();
        std::vector<uint8_t> active(G, 0);
        for (int64_t mi = 0; mi < k; ++mi) {
          const int64_t micro = step * k + mi;
          StepPlan plan = schedule->plan(micro, r);
          for (auto& p : params) p.tensor.requires_grad_(plan.trained[p.group] != 0);
          torch::Tensor total;
          {
            const AutocastScope autocast(job.precision, cpu);  // forward only, as the worker's
            // As the worker's forward: the micro-step's tasks in one call (a model that fuses
            // tasks runs them in one pass), each loss weighted by its share of the window's rows.
            const PassInputs in = pass_inputs(*data, plan, 0, plan.tasks.size(), micro, r, world, job.seed);
            const std::vector<torch::Tensor> losses = model->losses(in.parts);
            for (size_t i = 0; i < in.parts.size(); ++i) {
              auto l = losses[i] * (double(in.rows[i]) / double(job.data.batch_per_rank * k));
              total = total.defined() ? total + l : l;
            }
          }
          total.backward();
          for (int g = 0; g < G; ++g) {
            if (!discover) {
              active[g] |= plan.trained[g];
              continue;
            }
            for (int p : group_params[g]) active[g] |= params[p].tensor.grad().defined() ? 1 : 0;
          }
        }
        for (int g = 0; g < G; ++g) {
          if (!active[g]) continue;
          contributors[g] += 1;
          for (int p : group_params[g])
            if (params[p].tensor.grad().defined()) {
              sum[p].add_(params[p].tensor.grad());
              if (bf16_wire) shares[p].push_back(params[p].tensor.grad().clone());
            }
        }
      }
      torch::NoGradGuard ng;
      AdamSettings s;
      s.kind = job.optimizer.kind;
      s.lr = lr_at(job.optimizer, step, job.steps);
      s.beta1 = job.optimizer.beta1;
      s.beta2 = job.optimizer.beta2;
      s.eps = job.optimizer.eps;
      s.weight_decay = job.optimizer.weight_decay;
      for (int g = 0; g < G; ++g) {
        if (contributors[g] == 0 && job.comm.prune) continue;
        if (contributors[g] == 0) continue;  // lazy semantics hold with prune off as well
        const double div = job.comm.average == config::Average::World ? world : contributors[g];
        // Kept by its one trainer (its only possible contributor): nothing travels, nothing rounds.
        const bool kept = contributors[g] == 1 && replicas.decision(step, g).mode == ReplicaMode::keep;
        std::vector<torch::Tensor> ps, gs, ms, vs;
        for (int p : group_params[g]) {
          ps.push_back(params[p].tensor);
          gs.push_back(bf16_wire && !kept ? bf16_wire_sum(shares[p], sum[p], div) : sum[p] / div);
          ms.push_back(m[p]);
          vs.push_back(v[p]);
        }
        s.step = ++group_steps[g];
        s.grad_scale = clip_scale(gs, job.optimizer.clip_norm);
        adam_group(ps, gs, ms, vs, s);
      }
    }
    auto ckpt = find_latest_checkpoint(compare_dir);
    if (!ckpt || ckpt->step != job.steps) {
      err << "reference: no checkpoint of step " << job.steps << " in " << compare_dir << "\n";
      return 1;
    }
    // Relative to each group's parameter scale: max |thetad - reference| over the group divided
    // by max |reference| over the group (a lone bias element is judged at its layer's scale).
    double worst = 0;
    std::string worst_name;
    const CheckpointReader reader(*ckpt, G, "");
    const ParamGroups groups(params, G);
    for (int g = 0; g < G; ++g) {
      GroupState st = in_model_layout(reader.load_group(g), groups, g, ckpt->path);
      double max_ref = 1e-12, max_diff = 0;
      std::string where;
      for (size_t i = 0; i < st.names.size(); ++i) {
        const torch::Tensor* ref = nullptr;
        for (auto& p : params)
          if (p.name == st.names[i]) ref = &p.tensor;
        if (!ref) {
          err << "reference: checkpoint has unknown parameter " << st.names[i] << "\n";
          return 1;
        }
        max_ref = std::max(max_ref, ref->abs().max().item<double>());
        const double diff = (st.params[i] - *ref).abs().max().item<double>();
        if (diff > max_diff) max_diff = diff, where = st.names[i];
      }
      if (max_diff / max_ref > worst) worst = max_diff / max_ref, worst_name = where;
    }
    char verdict[256];
    std::snprintf(verdict, sizeof verdict, "reference: max relative difference %.3g (%s), tolerance %.1g\n", worst,
                  worst_name.empty() ? "-" : worst_name.c_str(), tol);
    out << verdict;
    if (worst > tol) return 1;
    return 0;
  } catch (const std::exception& e) {
    err << "reference: " << e.what() << "\n";
    return 1;
  }
}

// --cases LIST: every line's comparison in this one process, one verdict line each.
int compare_cases(const std::string& list) {
  std::ifstream in(list);
  if (!in) {
    std::cerr << "reference: cannot read " << list << "\n";
    return 1;
  }
  int failed = 0, cases = 0;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::vector<std::string> args;
    for (std::string w; words >> w;) args.push_back(w);
    if (args.empty() || args[0][0] == '#') continue;
    const std::string name = args[0];
    args.erase(args.begin());
    std::ostringstream text;
    const int rc = compare(args, text, text);
    std::string said = text.str();
    while (!said.empty() && said.back() == '\n') said.pop_back();
    for (char& c : said)
      if (c == '\n') c = ' ';
    std::cout << name << (rc == 0 ? " ok: " : " FAIL: ") << said << std::endl;
    failed += rc != 0;
    ++cases;
  }
  if (cases == 0) {
    std::cerr << "reference: no case in " << list << "\n";
    return 1;
  }
  return failed == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--cases") return compare_cases(argv[2]);
  return compare(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
