// Extreme classification (model.kind: extreme_classifier): a shared encoder and an output layer
// whose row slices are the tasks, with its synthetic data (a linear teacher per slice).
#include <algorithm>
#include <cmath>

#include "common/errors.hpp"
#include "daemon/models/chunked_softmax.hpp"
#include "daemon/models/kinds.hpp"
#include "daemon/models/param_builder.hpp"
#include "daemon/plan/placement.hpp"

namespace thetad::daemon {
namespace {

using namespace detail;

// Extreme classification: a shared encoder (Θ) and an output layer of `classes` rows split into
// `tasks` row slices, slice t = θ[t]. A batch of task t holds samples whose labels lie in slice
// t; the softmax runs over the batch's label classes plus `negatives_per_step` classes sampled
// from the slice (all of the slice when 0).
// With offload.shard_mb > 0 a slice is one parameter `output.<t>.weight_bias`, [rows x
// (hidden+1)] with the bias as its last column (same initial values as weight and bias), and the
// full softmax streams it in chunks of shard_mb worth of rows — from the store's row shards
// when offloaded, else from the parameter itself, in the same chunks either way.
class ExtremeClassifier : public TaskModel {
 public:
  ExtremeClassifier(const config::Job& job, const Placement& place, torch::Device device, bool lazy)
      : negatives_(job.model.negatives_per_step), sharded_(place.row_shards) {
    const auto& m = job.model;
    num_tasks_ = static_cast<int>(m.tasks);
    ParamBuilder pb(job, place, device, params_, lazy);
    int64_t dim = m.input_dim;
    for (int64_t i = 0; i < std::max<int64_t>(m.trunk_layers, 1); ++i) {
      encoder_.push_back(make_linear(pb, "encoder." + std::to_string(i), 0, dim, m.hidden));
      dim = m.hidden;
    }
    std::vector<torch::Tensor> mats;
    for (int64_t t = 0; t < m.tasks; ++t) {
      const int64_t rows = m.classes / m.tasks + (t < m.classes % m.tasks ? 1 : 0);
      const std::string name = "output." + std::to_string(t);
      const int g = int(t) + 1;
      if (!sharded_) {
        slices_.push_back(make_linear(pb, name, g, dim, rows));
        continue;
      }
      mats.push_back(pb.add_weight_bias(name + ".weight_bias", g, rows, dim, 1.0 / std::sqrt(double(dim))));
    }
    if (sharded_) {
      const int64_t chunk_rows = static_cast<int64_t>(job.offload.shard_bytes() / ((dim + 1) * sizeof(float)));
      THETAD_CHECK(chunk_rows >= 1, ConfigError, job.source, ": offload.shard_mb: one row of the output layer is ",
                   (dim + 1) * sizeof(float), " bytes, more than the shard");
      own_ = ResidentChunks(mats, chunk_rows);
    }
    mats_ = std::move(mats);
  }
  std::vector<NamedParam>& params() override { return params_; }
  bool row_chunked(int group) const override { return sharded_ && group >= 1; }
  void set_shard_source(ShardSource* source) override { source_ = source; }
  bool has_trunk_layers() const override { return true; }
  void set_layer_weights(LayerWeights* weights) override { weights_ = weights; }
  void set_activation_stash(ActivationStash* stash) override { stash_ = stash; }
  torch::Tensor features(const torch::Tensor& x) { return run_trunk(encoder_, x, weights_, stash_); }
  torch::Tensor forward(const torch::Tensor& x, int task) override {
    if (sharded_) return chunked_logits(features(x), chunks(), task);
    return slices_.at(task)(features(x));
  }
  LossKind loss_kind() const override { return LossKind::cross_entropy; }
  torch::Tensor loss(const Batch& b, int task, uint64_t sample_seed) override {
    const int64_t rows = sharded_ ? mats_.at(task).size(0) : slices_.at(task).w.size(0);
    const bool sampled = negatives_ > 0 && negatives_ < rows;
    if (sharded_ && !sampled) return chunked_softmax_xent(features(b.x), mats_.at(task), b.y, chunks(), task);
    if (!sampled) return task_loss(loss_kind(), forward(b.x, task), b.y);
    // Sampled softmax: the label classes and sampled negatives, deduplicated and sorted.
    auto gen = generator(sample_seed);
    auto neg = torch::randint(rows, {negatives_}, gen, torch::kInt64).to(b.y.device());
    auto cls = std::get<0>(torch::_unique(torch::cat({b.y, neg}), /*sorted=*/true));
    if (sharded_) return chunked_sampled_softmax_xent(features(b.x), mats_.at(task), b.y, cls, chunks(), task);
    const Linear& out = slices_.at(task);
    auto target = torch::searchsorted(cls, b.y);
    auto logits = torch::addmm(out.b.index_select(0, cls), features(b.x), out.w.index_select(0, cls).t());
    return task_loss(loss_kind(), logits, target);
  }

 private:
  ShardSource& chunks() { return source_ ? *source_ : own_; }

  int64_t negatives_;
  bool sharded_;
  std::vector<NamedParam> params_;
  std::vector<Linear> encoder_;
  std::vector<Linear> slices_;     // unsharded
  std::vector<torch::Tensor> mats_;  // sharded: [rows x (hidden+1)] per slice
  ResidentChunks own_;
  ShardSource* source_ = nullptr;
  LayerWeights* weights_ = nullptr;
  ActivationStash* stash_ = nullptr;
};

// Synthetic classification for the extreme classifier: per slice a fixed random linear teacher;
// the label is the teacher's argmax over the slice's classes.
class SyntheticClasses : public DataSource {
 public:
  SyntheticClasses(const config::Job& job, torch::Device device)
      : seed_(job.seed), in_(job.model.input_dim), device_(device) {
    for (int64_t t = 0; t < job.model.tasks; ++t) {
      const int64_t rows = job.model.classes / job.model.tasks + (t < job.model.classes % job.model.tasks ? 1 : 0);
      auto gen = generator(mix_seed(seed_, 0xc1a55, static_cast<uint64_t>(t)));
      teachers_.push_back(torch::randn({in_, rows}, gen, torch::kFloat32));
    }
  }
  Batch batch(int64_t step, int rank, int world, int task, int64_t rows) override {
    (void)world;
    auto gen = generator(mix_seed(seed_, static_cast<uint64_t>(step), static_cast<uint64_t>(rank),
                                  static_cast<uint64_t>(task) + 1));
    auto x = torch::randn({rows, in_}, gen, torch::kFloat32);
    auto y = torch::matmul(x, teachers_.at(task)).argmax(1);
    return {x.to(device_), y.to(device_)};
  }

 private:
  uint64_t seed_;
  int64_t in_;
  torch::Device device_;
  std::vector<torch::Tensor> teachers_;
};

}  // namespace

std::unique_ptr<TaskModel> make_extreme_classifier(const config::Job& job, const Placement& place, torch::Device device,
                                                   bool lazy_tasks) {
  return std::make_unique<ExtremeClassifier>(job, place, device, lazy_tasks);
}

std::unique_ptr<DataSource> make_synthetic_classes(const config::Job& job, torch::Device device) {
  return std::make_unique<SyntheticClasses>(job, device);
}

}  // namespace thetad::daemon
