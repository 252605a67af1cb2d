// Θ streamed layer by layer from its host store (see streamed_trunk.hpp).
#include "daemon/homes/streamed_trunk.hpp"
#include "daemon/homes/line_views.hpp"

#include <algorithm>
#include <string>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "daemon/plan/job_options.hpp"

namespace thetad::daemon {

StreamedTrunk::StreamedTrunk(const config::Job& job, TaskModel& model, ParamGroups& groups, const DataPlane& plane,
                             DeviceAdam& adam, Timeline* timeline)
    : job_(job), model_(model), groups_(groups), plane_(plane), adam_(adam), timeline_(timeline),
      line_views_(std::make_unique<LineViews>(groups, plane.device)), prefetch_(job.offload.shared_prefetch_layers) {
  // Θ's parameters come in layer order, weight then bias (multitask_mlp registers them so).
  const auto& members = groups_.members.at(0);
  layer_of_.assign(groups_.size(), -1);
  for (size_t i = 0; i + 1 < members.size(); i += 2) {
    Layer l{members[i], members[i + 1], static_cast<size_t>(groups_[members[i]].tensor.numel()),
            static_cast<size_t>(groups_[members[i + 1]].tensor.numel())};
    const std::string name = "trunk." + std::to_string(layer_params_.size());
    THETAD_CHECK(groups_[l.w].name == name + ".weight" && groups_[l.b].name == name + ".bias", InternalError,
                 "offload.shared: stream: Θ's parameter '", groups_[l.w].name, "' is not ", name, ".weight");
    layer_of_[static_cast<size_t>(l.w)] = layer_of_[static_cast<size_t>(l.b)] = static_cast<int>(layer_params_.size());
    layer_params_.push_back(l);
  }
  THETAD_CHECK(!layer_params_.empty() && layer_params_.size() * 2 == members.size(), InternalError,
               "offload.shared: stream: Θ is not a trunk of weight/bias layers");
  const size_t n = layer_params_.size();
  held_.assign(n, 0);
  slot_.assign(n, nullptr);
  forwards_.assign(n, 0);
  backwards_.assign(n, 0);
  written_.assign(n, 0);
  pushed_.assign(n, 0);
  stepped_.assign(n, 0);
  split_grad_.assign(n, {nullptr, nullptr});
  sum_.resize(n);
}

StreamedTrunk::~StreamedTrunk() = default;

void StreamedTrunk::build(HomeSetup& setup) {
  engine_ = &setup.engine;
  take_launches_ = setup.take_launches;
  offload::Device* device = setup.copy_device;
  std::vector<offload::GroupShape> shapes;
  for (size_t l = 0; l < layer_params_.size(); ++l)
    shapes.push_back({static_cast<int>(l) + 1, layer_params_[l].w_numel + layer_params_[l].b_numel, 1});
  if (!device) {
    if (plane_.gpu())
      own_device_ = offload::make_cuda_device(plane_.device.index(), plane_.compute_stream, plane_.device_sharers);
    else own_device_ = std::make_unique<offload::HostDevice>();
    device = own_device_.get();
  }
  // The window: the layer computing, the ones prefetched ahead and one whose compute is still
  // queued while the next copy lands. Shards would split a layer: never.
  offload::StoreOptions o = store_options(job_);
  o.device_slots = prefetch_ + 2;
  o.device_budget_bytes = 0;
  o.prefetch = 0;  // within the step only: a layer's next values exist once its CPU step is done
  o.shard_bytes = 0;
  // The next forward needs layer 0 first, whose gradient lands last: of the updates waiting on
  // the owner's CPU, the lowest layer goes first.
  o.lowest_group_first = true;
  // Every layer is used every step: the cache's placement fills its lines with the lowest
  // layers at step 0 and never evicts them. The others are streamed and updated by the CPU
  // AdamW (the store's transit lines are θ[t]'s: offload.uncached_update).
  o.cache_bytes = device_cache_bytes();
  o.uncached_update = offload::UncachedUpdate::Host;
  // The split's lines: the layer being updated, the ones prefetched for it, one still going out.
  o.update_lines = wants_split() ? prefetch_ + 2 : 0;
  const int L = layers();
  const auto all_layers = [L](int64_t) {
    std::vector<int> all;
    for (int l = 1; l <= L; ++l) all.push_back(l);
    return all;
  };
  try {
    store_ = std::make_unique<offload::ParamStore>(o, shapes, *device, all_layers, all_layers);
  } catch (const ConfigError& e) {
    throw ConfigError(job_.source + ": offload.shared: stream: Θ's host store (" + std::to_string(L) +
                      " trunk layers, " + std::to_string(groups_.numel(0) * 4) + " bytes of parameters" +
                      (o.update_lines > 0 ? ", and update lines for offload.shared_split_layers: " +
                                                job_.offload.shared_split_layers
                                          : std::string()) +
                      "): " + e.what());
  }
  const int64_t want = job_.offload.shared_device_layer_count();  // auto asked for what fits
  if (store_->cache().cache_lines() < want)  // the fewest any rank could allocate: every rank throws
    throw ConfigError(job_.source + ": offload.shared_device_layers: " + std::to_string(want) + " layers need " +
                      std::to_string(o.cache_bytes) + " bytes of device memory (" +
                      std::to_string(store_->cache().cache_line_bytes()) + " per layer: values and Adam moments), but the " +
                      "device had room for " + std::to_string(store_->cache().cache_lines()) + "; lower it");
  resolve_split();
  store_->init_all([this](int g, float* dst) {
    torch::NoGradGuard no_grad;  // thread-local: this runs on the store's threads
    const Layer& l = layer_params_[static_cast<size_t>(g - 1)];
    for (int p : {l.w, l.b}) {
      const auto& t = groups_[p].tensor;
      torch::from_blob(dst + offset_in_layer(p), t.sizes(), torch::kFloat32).copy_(t.detach());
    }
  });
  // The model's Θ becomes placeholders (autograd metadata, requires_grad per micro-step): the
  // trunk layer function takes the values from acquire().
  torch::NoGradGuard no_grad;
  for (int p : groups_.members[0]) {
    groups_[p].init = nullptr;
    auto& t = groups_[p].tensor;
    t.set_data(torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat32).device(plane_.device)).expand(t.sizes()));
  }
  THETAD_LOG(info, "offload") << "Θ streamed: " << L << " trunk layers, " << store_->plan().slots << " device slots of "
                              << store_->plan().slot_bytes << " bytes (prefetch " << prefetch_ << "), host arena "
                              << store_->arena().bytes() << " bytes; " << store_->cache().cache_lines()
                              << " layers kept on the device (" << store_->stats().cache_line_bytes << " bytes); "
                              << split_ << " streamed layers updated on the device (offload.shared_split_layers: "
                              << job_.offload.shared_split_layers << ", " << store_->update_line_bytes()
                              << " bytes of update lines)";
  model_.set_layer_weights(this);  // the trunk layer function reads Θ's layers from here
}

size_t StreamedTrunk::offset_in_layer(int p) const {
  const Layer& l = layer_params_.at(static_cast<size_t>(layer_of_.at(static_cast<size_t>(p))));
  return p == l.w ? 0 : l.w_numel;
}

void StreamedTrunk::start_window(const WindowPlan& plan, const WindowSettings& w) {
  const int64_t step = plan.window;
  step_ = step;
  early_ = w.update_known ? std::optional<AdamSettings>(w.for_group(0)) : std::nullopt;
  store_->place(step);  // step 0: the device's layers are loaded into their lines
  std::fill(pushed_.begin(), pushed_.end(), 0);
  std::fill(stepped_.begin(), stepped_.end(), 0);
  std::fill(split_grad_.begin(), split_grad_.end(), std::array<const float*, 2>{nullptr, nullptr});
  // The previous step's copies of Θ's buckets to the host read memory this step's backward
  // rewrites (on the compute stream); they started during that step's backward.
  store_->compute_after_pushes();
  std::fill(written_.begin(), written_.end(), 0);
}

void StreamedTrunk::start_micro(const StepPlan& plan) {
  trained_ = plan.trained[0] != 0 && job_.model.train_shared;
  reached_ = false;
  std::fill(forwards_.begin(), forwards_.end(), 0);
  std::fill(backwards_.begin(), backwards_.end(), 0);
}

// Pins the layer's slot; `order` false: a prefetch, whose copy runs while queued compute does.
void StreamedTrunk::hold(int layer, bool order) {
  const auto l = static_cast<size_t>(layer);
  if (layer_on_device(layer)) return;  // its line, which the compute stream waited for at its load
  if (held_[l]) {
    if (order) store_->order_compute(unit(layer));
    return;
  }
  const int64_t t_us = Timeline::now_us();
  slot_[l] = store_->acquire(unit(layer), step_, order);
  held_[l] = 1;
  if (timeline_)
    timeline_->record(Lane::h2d, (order ? "acquire Θ layer " : "prefetch Θ layer ") + std::to_string(layer), t_us,
                      Timeline::now_us() - t_us, {{"layer", int64_t(layer)}});
}

std::pair<torch::Tensor, torch::Tensor> StreamedTrunk::acquire(int layer, bool backward) {
  THETAD_CHECK(layer >= 0 && layer < layers(), InternalError, "trunk layer ", layer, " out of range");
  hold(layer, /*order=*/true);
  // The next layers in this pass's direction are copied while this one computes.
  for (int64_t k = 1; k <= prefetch_; ++k) {
    const int64_t next = backward ? layer - k : layer + k;
    if (next >= 0 && next < layers()) hold(static_cast<int>(next), /*order=*/false);
  }
  if (!backward && trained_) {
    ++forwards_[static_cast<size_t>(layer)];
    reached_ = true;
  }
  if (backward && trained_)  // the split's layers: their lines come in while backward reaches them
    for (int64_t k = 0; k <= prefetch_; ++k) prefetch_update_line(layer - static_cast<int>(k));
  const Layer& l = layer_params_[static_cast<size_t>(layer)];
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(plane_.device);
  float* base = layer_on_device(layer) ? store_->cache().cached_params(layer + 1) : slot_[static_cast<size_t>(layer)];
  return {torch::from_blob(base, groups_[l.w].tensor.sizes(), opts),
          torch::from_blob(base + l.w_numel, groups_[l.b].tensor.sizes(), opts)};
}

void StreamedTrunk::prefetch_update_line(int layer) {
  if (layer < 0 || !split_now(layer) || store_->in_update_line(layer + 1) || !store_->update_room()) return;
  const int64_t t_us = Timeline::now_us();
  store_->load_for_update(layer + 1, /*order_compute=*/false);
  if (timeline_)
    timeline_->record(Lane::h2d, "update line Θ layer " + std::to_string(layer), t_us, Timeline::now_us() - t_us,
                      {{"layer", int64_t(layer)}});
}

void StreamedTrunk::release(int layer) {
  const auto l = static_cast<size_t>(layer);
  if (!held_.at(l)) return;
  store_->release(unit(layer));
  held_[l] = 0;
}

// Autograd sums the gradients a leaf gets from its uses in one backward (in the order they
// arrive) before accumulating once into .grad; so does this, so that the result is bitwise the
// resident one. The layer's sum is final once every forward of the micro-step has come back.
// Under bf16 autocast the resident bias is cast once per forward (autocast's cache) and its uses'
// gradients are summed in bf16 before that cast widens them: the bias sum is bf16 here too.
void StreamedTrunk::grad(int layer, const torch::Tensor& dW, const torch::Tensor& db) {
  const auto l = static_cast<size_t>(layer);
  auto& s = sum_.at(l);
  torch::NoGradGuard no_grad;
  const bool bf16 = job_.precision == config::Precision::Bf16;
  const torch::Tensor w = dW.to(torch::kFloat32), b = db.to(bf16 ? torch::kBFloat16 : torch::kFloat32);
  if (!s.first.defined()) s = {w, b};
  else s = {s.first + w, s.second + b};
  if (++backwards_[l] >= forwards_[l]) commit(layer);
}

// The layer's gradient of this backward goes into its bucket regions (copied on the window's
// first, added after: the engine's overwrite mode, as GradHooks does for resident groups).
void StreamedTrunk::commit(int layer) {
  const auto l = static_cast<size_t>(layer);
  torch::Tensor w = std::move(sum_[l].first), b = sum_[l].second.to(torch::kFloat32);
  sum_[l] = {};
  const Layer& lp = layer_params_[l];
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(plane_.device);
  const bool first = !written_[l];
  plane_.on_compute_stream([&] {
    for (const auto& [p, g] : {std::pair<int, const torch::Tensor*>{lp.w, &w}, {lp.b, &b}}) {
      torch::Tensor view = torch::from_blob(engine_->grad(p), groups_[p].tensor.sizes(), opts);
      if (first) view.copy_(*g);
      else view.add_(*g);
    }
  });
  written_[l] = 1;
  take_launches_(engine_->mark_ready(lp.w));
  take_launches_(engine_->mark_ready(lp.b));
}

// On GPUs the D2H stream waits for the bucket's allreduce (the host does not) and the copy runs
// while backward goes on. Where copies are synchronous the push waits for after_reduce: a host
// wait here, inside the engine's launch, could hold up the collectives other ranks need first.
void StreamedTrunk::on_bucket_launch(const comm::Launched& l) {
  if (l.contributors == 0) return;  // no rank trained Θ: not stepped, nothing to copy
  void* d2h = store_->d2h_stream();
  if (!d2h) {
    deferred_.push_back({l.bucket, l.data});
    return;
  }
  l.work->block_stream(d2h, engine_->communicator().default_timeout());
  push_bucket(l.bucket, l.data, l.contributors > 0, l.work.get());  // -1: counts unknown, whether Θ is stepped is not
}

void StreamedTrunk::after_reduce() {
  const bool trained = engine_->contributors()[0] != 0;
  for (const auto& [b, data] : deferred_)
    if (trained) push_bucket(b, data, true, nullptr);
  deferred_.clear();
}

// The owners of the bucket's layers copy their parts to the landing areas. A layer whose
// gradient is then all pushed is stepped at once where the settings are known (`trained`: Θ is
// stepped this window), so that the CPU AdamW of the last layers runs while backward reaches the
// first ones and the next forward finds layer 0 updated sooner. Every rank counts alike.
//
// A layer of the split (trained, settings known) is not pushed: once both its gradients are
// reduced, the device AdamW steps it in its update line (the compute stream ordered after the
// bucket's allreduce).
void StreamedTrunk::push_bucket(int b, const float* data, bool trained, comm::Work* work) {
  const comm::BucketPlan& plan = engine_->plan();
  const comm::Bucket& bucket = plan.buckets[static_cast<size_t>(b)];
  const int64_t t_us = Timeline::now_us();
  bool compute_waits = false;
  for (size_t k = 0; k < bucket.params.size(); ++k) {
    const int p = bucket.params[k];
    const int layer = layer_of_[static_cast<size_t>(p)];
    if (layer_on_device(layer)) continue;  // its gradient stays in the bucket for the device AdamW
    if (trained && split_now(layer)) {
      if (work && !compute_waits) work->block_stream(plane_.compute_stream, engine_->communicator().default_timeout());
      compute_waits = true;
      auto& grads = split_grad_[static_cast<size_t>(layer)];
      grads[p == layer_params_[static_cast<size_t>(layer)].w ? 0 : 1] = data + bucket.offsets[k];
      if (grads[0] && grads[1]) update_split_layer(layer);
      continue;
    }
    if (store_->owns(layer + 1))
      store_->push_grad_range(layer + 1, offset_in_layer(p), data + bucket.offsets[k],
                              plan.params[static_cast<size_t>(p)].numel);
    if (++pushed_[static_cast<size_t>(layer)] == 2 && trained && early_) step_layer(layer, to_hyper(*early_));
  }
  if (timeline_)
    timeline_->record(Lane::d2h, "gradient Θ bucket " + std::to_string(b), t_us, Timeline::now_us() - t_us,
                      {{"bytes", int64_t(bucket.numel * sizeof(float))}});
}

// The layer's values and moments in its update line (prefetched, or loaded now), the device AdamW
// over them and its reduced gradients in Θ's buckets, then the line back to the host.
void StreamedTrunk::update_split_layer(int layer) {
  const int64_t t_us = Timeline::now_us();
  const Layer& lp = layer_params_[static_cast<size_t>(layer)];
  const auto& grads = split_grad_[static_cast<size_t>(layer)];
  plane_.on_compute_stream([&] {
    torch::NoGradGuard no_grad;
    float* line = store_->load_for_update(layer + 1);  // the compute stream waits for it
    const size_t n = store_->update_line_numel();
    const LineTensors& views = line_views_->of(layer + 1, {lp.w, lp.b}, [this](int p) { return offset_in_layer(p); },
                                               line, line + n, line + 2 * n);
    const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(plane_.device);
    AdamOperands ops;
    ops.params = views.params;
    ops.exp_avg = views.exp_avg;
    ops.exp_avg_sq = views.exp_avg_sq;
    ops.grads = {torch::from_blob(const_cast<float*>(grads[0]), groups_[lp.w].tensor.sizes(), opts),
                 torch::from_blob(const_cast<float*>(grads[1]), groups_[lp.b].tensor.sizes(), opts)};
    adam_.step(ops, *early_, /*clip_norm=*/0);
  });
  store_->updated_on_device(layer + 1);
  stepped_[static_cast<size_t>(layer)] = 1;
  if (timeline_)
    timeline_->record(Lane::compute, "adam Θ layer " + std::to_string(layer) + " (update line)", t_us,
                      Timeline::now_us() - t_us, {{"layer", int64_t(layer)}});
}

void StreamedTrunk::step_layer(int layer, const offload::AdamHyper& h) {
  store_->step_group(layer + 1, h);
  stepped_[static_cast<size_t>(layer)] = 1;
}

void StreamedTrunk::step(int g, const AdamSettings& s) {
  (void)g;
  step_on_device(s);
  const int64_t t_us = Timeline::now_us();
  for (int l = 0; l < layers(); ++l)
    if (!stepped_[static_cast<size_t>(l)]) step_layer(l, to_hyper(s));
  if (timeline_) timeline_->record(Lane::cpu_adam, "adam Θ (layers)", t_us, Timeline::now_us() - t_us);
}

// The device's layers in one device AdamW over their lines and their reduced gradients in Θ's
// buckets (the compute stream is ordered after the allreduces): the math of resident Θ.
void StreamedTrunk::step_on_device(const AdamSettings& s) {
  if (store_->cache().cache_lines() == 0) return;
  const int64_t t_us = Timeline::now_us();
  AdamOperands ops;
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(plane_.device);
  for (int l = 0; l < layers(); ++l) {
    if (!layer_on_device(l)) continue;
    const Layer& lp = layer_params_[static_cast<size_t>(l)];
    const LineTensors& line = line_views_->of(l + 1, {lp.w, lp.b}, [this](int p) { return offset_in_layer(p); },
                                              store_->cache().cached_params(l + 1), store_->cache().cached_exp_avg(l + 1),
                                              store_->cache().cached_exp_avg_sq(l + 1));
    for (size_t k = 0; k < 2; ++k) {
      const int p = k == 0 ? lp.w : lp.b;
      ops.params.push_back(line.params[k]);
      ops.exp_avg.push_back(line.exp_avg[k]);
      ops.exp_avg_sq.push_back(line.exp_avg_sq[k]);
      ops.grads.push_back(torch::from_blob(engine_->grad(p), groups_[p].tensor.sizes(), opts));
    }
  }
  adam_.step(ops, s, /*clip_norm=*/0);  // as the CPU AdamW of the streamed layers: no clipping of Θ here
  for (int l = 0; l < layers(); ++l)
    if (layer_on_device(l)) step_layer(l, to_hyper(s));  // counts the update
  if (timeline_) timeline_->record(Lane::compute, "adam Θ (device layers)", t_us, Timeline::now_us() - t_us);
}

void StreamedTrunk::skip(int g) {
  (void)g;
  for (int l = 1; l <= layers(); ++l) store_->discard_pushes(l);
}

void StreamedTrunk::release_step(int64_t step) {
  store_->release_step(step);
  std::fill(held_.begin(), held_.end(), 0);
}

void StreamedTrunk::add_stats(StepRecord& rec) {
  rec.theta = traffic_since(store_->stats(), last_stats_);
  rec.theta_device_slot_bytes = device_memory().lines;
}

HomeMemory StreamedTrunk::device_memory() const {
  const offload::StoreStats st = store_->stats();
  HomeMemory m;
  m.lines = static_cast<int64_t>(st.device_slot_bytes + st.cache_line_bytes + store_->update_line_bytes());
  return m;
}

GroupState StreamedTrunk::state(int g) {
  (void)g;
  const int64_t n = groups_.numel(0);
  std::vector<torch::Tensor> flat;
  for (int i = 0; i < 3; ++i) flat.push_back(torch::empty({n}, torch::kFloat32));
  for (const Layer& l : layer_params_) {
    const size_t off = groups_.offset[static_cast<size_t>(l.w)];
    store_->read_group(layer_of_[static_cast<size_t>(l.w)] + 1, flat[0].data_ptr<float>() + off,
                       flat[1].data_ptr<float>() + off, flat[2].data_ptr<float>() + off);
  }
  return group_state_of_flat(groups_, 0, flat);
}

void StreamedTrunk::restore(int g, const GroupState& st) {
  (void)g;
  const auto& members = groups_.members[0];
  for (const Layer& l : layer_params_) {
    std::vector<torch::Tensor> fp, fm, fv;
    for (int p : {l.w, l.b}) {
      const size_t i = static_cast<size_t>(std::find(members.begin(), members.end(), p) - members.begin());
      fp.push_back(st.params.at(i).reshape({-1}));
      fm.push_back(st.exp_avg.at(i).reshape({-1}));
      fv.push_back(st.exp_avg_sq.at(i).reshape({-1}));
    }
    auto cp = torch::cat(fp).contiguous(), cm = torch::cat(fm).contiguous(), cv = torch::cat(fv).contiguous();
    store_->write_group(layer_of_[static_cast<size_t>(l.w)] + 1, cp.data_ptr<float>(), cm.data_ptr<float>(),
                        cv.data_ptr<float>());
  }
}

const float* StreamedTrunk::host_values(int p) {
  return store_->group_params(layer_of_.at(static_cast<size_t>(p)) + 1) + offset_in_layer(p);
}

}  // namespace thetad::daemon
