// A transformer's frozen base brought onto the device a layer at a time (model.train_shared:
// false with offload.shared: stream or model.base_shard: node): the matrices of every layer's
// GEMMs live in host memory shared by the node's ranks (offload/frozen_layers.hpp, one copy a
// host), each layer brought into one of offload.shared_prefetch_layers + 2 device slots ahead of
// its use, in forward and again, walking back, in backward, and its slot reused once the layer's
// GEMMs are queued. Streamed, a layer is copied from the pinned host copy; sharded, each of the
// node's devices holds 1/N of every layer and a layer is gathered from all of them
// (offload/node_shards.hpp). With model.base_quant: nf4 the layers are held, moved and gathered
// as nf4 codes and absmax (4.25 bits a value) and dequantized into one scratch just before each
// GEMM, as a resident nf4 base is. The model reads
// those GEMMs' matrices through it (FrozenWeights); the parameters they came from point at the
// host copy (NamedParam::host_only), where checkpoints, the final hash and the merged export read
// them. Norms, embeddings and the output layer stay in their resident home.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <vector>

#include "config/job.hpp"
#include "daemon/device/data_plane.hpp"
#include "daemon/models/model.hpp"
#include "daemon/ops/frozen_weight.hpp"
#include "daemon/ops/nf4.hpp"
#include "daemon/plan/placement.hpp"
#include "offload/device.hpp"
#include "offload/frozen_layers.hpp"

namespace thetad::daemon {

class StreamedBase final : public FrozenWeights {
 public:
  // Takes the model's layers' GEMMs (TaskModel::frozen_gemms; a base built on the host) into host
  // memory, collective over the node's ranks: a drawn base's placeholders are drawn there, as the
  // model would hold them. The model reads them from here from now on.
  StreamedBase(const config::Job& job, const Placement& placement, TaskModel& model, const DataPlane& plane);
  ~StreamedBase() override;
  StreamedBase(const StreamedBase&) = delete;
  StreamedBase& operator=(const StreamedBase&) = delete;

  torch::Tensor acquire(int id, torch::ScalarType dtype, bool backward) override;
  void done(int id) override;
  offload::FrozenLayersStats stats() const { return layers_->stats(); }

 private:
  struct Gemm {
    int layer, part;  // its first part (nf4: the codes; the absmax next)
    int64_t rows, cols;
  };
  void hold_parameters(const std::vector<BaseGemm>& gemms,
                       const std::map<const c10::TensorImpl*, NamedParam*>& param_of);

  const DataPlane& plane_;
  torch::ScalarType held_;  // the dtype the GEMMs read: the frozen base's (bf16 where it is held so)
  bool nf4_;                // model.base_quant: nf4: the layers held, moved and gathered as codes
  Nf4Scratch scratch_;      // nf4: what each GEMM's matrix is dequantized into, in turn
  std::unique_ptr<offload::Device> device_;
  std::unique_ptr<offload::FrozenLayers> layers_;
  std::map<int, Gemm> gemms_;
};

}  // namespace thetad::daemon
