// A step's gradient norms per group (see grad_norms.hpp).
#include "daemon/train/grad_norms.hpp"

#include "daemon/models/param_groups.hpp"

namespace thetad::daemon {

GradNormParts grad_norm_parts(comm::Engine& engine, const ParamGroups& groups, const std::vector<comm::GradMemory>& modes,
                              const std::vector<int32_t>& contributors, torch::Device device, bool kept_only) {
  GradNormParts out;
  const int rank = engine.communicator().rank();
  std::vector<torch::Tensor> pieces;
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  const comm::BucketPlan& plan = engine.plan();
  for (size_t g = 0; g < modes.size() && g < contributors.size(); ++g) {
    if (contributors[g] <= 0) continue;
    const int keeper = contributors[g] == 1 ? engine.kept_by(static_cast<int>(g)) : -1;
    if ((keeper >= 0 && keeper != rank) || (kept_only && keeper != rank)) continue;
    switch (modes[g]) {
      case comm::GradMemory::none: break;  // never a gradient
      case comm::GradMemory::streamed: out.whole = false; break;
      case comm::GradMemory::adopted:  // autograd's own tensors, one per parameter
        for (int p : groups.members[g]) {
          const int64_t n = groups[p].tensor.numel();
          if (n == 0) continue;
          pieces.push_back(torch::from_blob(engine.grad(p), {n}, opts));
          out.group.push_back(static_cast<int>(g));
        }
        break;
      case comm::GradMemory::owned:
      case comm::GradMemory::overwrite:
      case comm::GradMemory::pooled:  // a flat buffer per bucket: buckets never mix groups
        for (int b : plan.group_buckets[g]) {
          const auto n = static_cast<int64_t>(plan.buckets[static_cast<size_t>(b)].numel);
          if (n == 0) continue;
          pieces.push_back(torch::from_blob(engine.bucket_data(b), {n}, opts));
          out.group.push_back(static_cast<int>(g));
        }
        break;
    }
    out.kept.resize(out.group.size(), keeper == rank ? 1 : 0);
  }
  if (!pieces.empty()) out.norms = torch::stack(torch::_foreach_norm(pieces, 2));
  return out;
}

}  // namespace thetad::daemon
