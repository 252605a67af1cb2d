// θ[t] in the host store: what checkpoints, resume, the final hash and an evaluation read of it
// (see store_home.hpp), and the stores' per-step traffic (shared with the streamed trunk).
#include <cstring>
#include <string>
#include <utility>

#include "common/errors.hpp"
#include "daemon/homes/store_home.hpp"

namespace thetad::daemon {

StoreTraffic traffic_since(const offload::StoreStats& ss, offload::StoreStats& last) {
  StoreTraffic s;
  s.h2d_bytes = static_cast<int64_t>(ss.h2d_bytes - last.h2d_bytes);
  s.d2h_bytes = static_cast<int64_t>(ss.d2h_bytes - last.d2h_bytes);
  s.swap_hits = static_cast<int64_t>(ss.swap_hits - last.swap_hits);
  s.swap_misses = static_cast<int64_t>(ss.swap_misses - last.swap_misses);
  s.host_pinned_bytes = static_cast<int64_t>(ss.host_pinned_bytes);
  s.cache_loads = static_cast<int64_t>(ss.cache_loads - last.cache_loads);
  s.cache_flushes = static_cast<int64_t>(ss.cache_flushes - last.cache_flushes);
  s.device_steps = static_cast<int64_t>(ss.device_steps - last.device_steps);
  s.streamed_steps = static_cast<int64_t>(ss.streamed_steps - last.streamed_steps);
  s.cpu_adam_ms = ss.cpu_adam_ms - last.cpu_adam_ms;
  s.acquire_wait_ms = ss.acquire_wait_ms - last.acquire_wait_ms;
  last = ss;
  return s;
}

GroupState group_state_of_flat(const ParamGroups& groups, int g, const std::vector<torch::Tensor>& flat) {
  GroupState st;
  st.group = g;
  for (int p : groups.members[static_cast<size_t>(g)]) {
    const auto& t = groups[p].tensor;
    const auto off = static_cast<int64_t>(groups.offset[static_cast<size_t>(p)]);
    st.names.push_back(groups[p].name);
    st.params.push_back(flat[0].narrow(0, off, t.numel()).view(t.sizes()));
    st.exp_avg.push_back(flat[1].narrow(0, off, t.numel()).view(t.sizes()));
    st.exp_avg_sq.push_back(flat[2].narrow(0, off, t.numel()).view(t.sizes()));
  }
  return st;
}

GroupState StoreHome::state(int g) {
  if (!store_->held(g)) {
    GroupState st;
    st.group = g;
    st.initial = true;
    return st;
  }
  const int64_t n = groups_.numel(g);
  std::vector<torch::Tensor> flat;
  for (int i = 0; i < 3; ++i) flat.push_back(torch::empty({n}, torch::kFloat32));
  store_->read_group(g, flat[0].data_ptr<float>(), flat[1].data_ptr<float>(), flat[2].data_ptr<float>());
  return group_state_of_flat(groups_, g, flat);
}

void StoreHome::restore(int g, const GroupState& st) {
  if (st.initial) return;  // the store holds the initial values already (or draws them)
  if (!store_->held(g)) {
    // Never updated (its values are the initial ones): nothing to hold. Updated: the schedule
    // that left it out is not the one that trained it.
    if (st.steps == 0) return;
    throw ConfigError(job_.source + ": offload.host_groups: scheduled: the checkpoint holds group " +
                      std::to_string(g) + " after " + std::to_string(st.steps) +
                      " updates, but this job's schedule never uses it, so the host arena has no room "
                      "for it (the world size or the schedule changed since?); set offload.host_groups: all");
  }
  std::vector<torch::Tensor> fp, fm, fv;
  for (size_t i = 0; i < st.params.size(); ++i) {
    fp.push_back(st.params[i].reshape({-1}));
    fm.push_back(st.exp_avg[i].reshape({-1}));
    fv.push_back(st.exp_avg_sq[i].reshape({-1}));
  }
  auto cp = torch::cat(fp).contiguous(), cm = torch::cat(fm).contiguous(), cv = torch::cat(fv).contiguous();
  store_->write_group(g, cp.data_ptr<float>(), cm.data_ptr<float>(), cv.data_ptr<float>());
}

const float* StoreHome::host_values(int p) {
  const NamedParam& np = groups_[p];
  return store_->group_params(np.group) + groups_.offset[static_cast<size_t>(p)];
}

bool StoreHome::initial(int g) const { return !store_->held(g); }

void StoreHome::initial_values(int p, float* dst) const {
  const NamedParam& np = groups_[p];
  THETAD_CHECK(np.init != nullptr, InternalError, "parameter '", np.name, "' has no initial values to draw");
  torch::NoGradGuard no_grad;
  torch::Tensor view = torch::from_blob(dst, np.tensor.sizes(), torch::kFloat32);
  np.init(view);
}

std::function<void()> StoreHome::lend_to_forward(int g) {
  THETAD_CHECK(!model_.row_chunked(g), InternalError, "group ", g,
               " is streamed in row shards: it has no forward outside a step");
  torch::NoGradGuard no_grad;
  const bool held = store_->held(g);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> bound;  // each parameter, and what it viewed
  for (int p : groups_.members[static_cast<size_t>(g)]) {
    torch::Tensor& t = groups_[p].tensor;
    torch::Tensor values = torch::empty(t.sizes(), torch::kFloat32);
    if (held) std::memcpy(values.data_ptr<float>(), host_values(p), static_cast<size_t>(t.numel()) * sizeof(float));
    else initial_values(p, values.data_ptr<float>());
    bound.emplace_back(t, t.data());
    t.set_data(values.to(plane_.device));
  }
  return [bound]() mutable {
    for (auto& [param, before] : bound) param.set_data(before);
  };
}

}  // namespace thetad::daemon
