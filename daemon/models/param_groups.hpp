// The model's parameters by group (0 = shared Θ, t+1 = task t): which parameters each group
// holds, in registration order, and where each one's values start in its group's flat layout
// (the host store's and the checkpoint's order). Built once from the model; every room of the
// worker reads it, none changes it. Also one group's state as checkpoints hold it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "daemon/models/model.hpp"

namespace thetad::daemon {

struct ParamGroups {
  std::vector<NamedParam>* params = nullptr;
  std::vector<std::vector<int>> members;  // group -> indices into *params
  std::vector<size_t> offset;             // param -> first element in its group's flat layout
  std::vector<int> position;              // param -> its index in members[its group]

  ParamGroups(std::vector<NamedParam>& all, int num_groups) : params(&all), members(num_groups) {
    offset.assign(all.size(), 0);
    position.assign(all.size(), 0);
    std::vector<size_t> filled(static_cast<size_t>(num_groups), 0);
    for (size_t i = 0; i < all.size(); ++i) {
      const auto g = static_cast<size_t>(all[i].group);
      position[i] = static_cast<int>(members.at(g).size());
      members.at(g).push_back(static_cast<int>(i));
      offset[i] = filled[g];
      filled[g] += static_cast<size_t>(all[i].tensor.numel());
    }
  }
  int num_groups() const { return static_cast<int>(members.size()); }
  NamedParam& operator[](int p) { return (*params)[static_cast<size_t>(p)]; }
  const NamedParam& operator[](int p) const { return (*params)[static_cast<size_t>(p)]; }
  size_t size() const { return params->size(); }
  // Elements of a group's parameters together.
  int64_t numel(int group) const {
    int64_t n = 0;
    for (int p : members.at(static_cast<size_t>(group))) n += (*this)[p].tensor.numel();
    return n;
  }
};

// One group's state: parameters and AdamW moments by name, and its optimizer step count.
struct GroupState {
  int group = 0;
  std::vector<std::string> names;
  std::vector<torch::Tensor> params, exp_avg, exp_avg_sq;  // CPU tensors when loaded
  int64_t steps = 0;
  // Never updated, values not copied: the group is at its initial values, which the model draws
  // (a group the host arena does not hold; in a checkpoint, zero values with step count 0).
  bool initial = false;
};

}  // namespace thetad::daemon
