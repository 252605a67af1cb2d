// A device line's values and Adam moments (a θ[t] cache or transit line, a device layer of the
// streamed trunk) as one tensor per parameter, built when a group comes to a line and reused
// while it stays there: a step that updates a group on its line builds no views. Kept per line
// (by its address), so its memory follows the lines, not T.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <unordered_map>
#include <vector>

#include "daemon/models/param_groups.hpp"

namespace thetad::daemon {

// One group's line, tensors in the order of the group's `members` given to LineViews::of.
struct LineTensors {
  std::vector<torch::Tensor> params, exp_avg, exp_avg_sq;
};

class LineViews {
 public:
  LineViews(const ParamGroups& groups, torch::Device device) : groups_(groups), device_(device) {}

  // Group g's parameters `members` (indices of ParamGroups), each at `offset(p)` elements into a
  // line whose values start at `values` and moments at `m` and `v`.
  const LineTensors& of(int g, const std::vector<int>& members, const std::function<size_t(int)>& offset,
                        float* values, float* m, float* v) {
    Entry& e = by_line_[values];
    if (e.group == g && e.m == m) return e.views;
    e = Entry{g, m, {}};
    const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
    for (int p : members) {
      const auto sizes = groups_[p].tensor.sizes();
      const size_t off = offset(p);
      e.views.params.push_back(torch::from_blob(values + off, sizes, opts));
      e.views.exp_avg.push_back(torch::from_blob(m + off, sizes, opts));
      e.views.exp_avg_sq.push_back(torch::from_blob(v + off, sizes, opts));
    }
    return e.views;
  }

 private:
  struct Entry {
    int group = -1;
    const float* m = nullptr;
    LineTensors views;
  };
  const ParamGroups& groups_;
  const torch::Device device_;
  std::unordered_map<const float*, Entry> by_line_;
};

}  // namespace thetad::daemon
