// The transformer's frozen base streamed from host memory (see streamed_base.hpp).
#include "daemon/homes/streamed_base.hpp"

#include <algorithm>
#include <cstring>

#include "comm/node_memory.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "daemon/ops/precision.hpp"
#include "offload/util.hpp"

namespace thetad::daemon {
namespace {

int64_t rows_of(const BaseGemm& g) {
  int64_t rows = 0;
  for (const torch::Tensor& w : g.weights) rows += w.size(0);
  return rows;
}

}  // namespace

StreamedBase::StreamedBase(const config::Job& job, TaskModel& model, const DataPlane& plane)
    : plane_(plane), held_(frozen_base_in_bf16(job) ? torch::kBFloat16 : torch::kFloat32) {
  std::vector<BaseGemm> gemms = model.frozen_gemms();
  std::map<const c10::TensorImpl*, NamedParam*> param_of;
  for (NamedParam& p : model.params()) param_of[p.tensor.unsafeGetTensorImpl()] = &p;
  // Layers in order, each layer's GEMMs in the model's order: a layer is one copy.
  std::vector<std::vector<size_t>> parts;
  std::vector<const BaseGemm*> order;
  for (const BaseGemm& g : gemms) {
    if (g.layer < 0) continue;
    if (static_cast<size_t>(g.layer) >= parts.size()) parts.resize(static_cast<size_t>(g.layer) + 1);
    const int64_t rows = rows_of(g), cols = g.weights.front().size(1);
    gemms_[g.id] = {g.layer, static_cast<int>(parts[static_cast<size_t>(g.layer)].size()), rows, cols};
    parts[static_cast<size_t>(g.layer)].push_back(static_cast<size_t>(rows * cols) * c10::elementSize(held_));
    order.push_back(&g);
  }
  if (plane.gpu())
    device_ = offload::make_cuda_device(plane.device.index(), plane.compute_stream, plane.device_sharers);
  else
    device_ = std::make_unique<offload::HostDevice>();
  layers_ = std::make_unique<offload::FrozenLayers>(comm::make_node_memory(offload::timeout_of(job.comm.timeout_s)),
                                                    parts, *device_, static_cast<int>(job.offload.shared_prefetch_layers),
                                                    job.offload.host_limit_bytes(),
                                                    job.model.base_shard == config::BaseShard::Node
                                                        ? offload::LayerSource::node_shards
                                                        : offload::LayerSource::host);
  std::map<std::pair<int, int>, const BaseGemm*> at;
  for (const BaseGemm* g : order) at[{gemms_.at(g->id).layer, gemms_.at(g->id).part}] = g;
  // Each weight's values as the model holds them (a placeholder drawn as the model would draw it),
  // in the GEMMs' dtype, its rows after the rows of the weights before it.
  layers_->fill([&](int layer, int part, char* dst) {
    torch::NoGradGuard no_grad;
    for (const torch::Tensor& w : at.at({layer, part})->weights) {
      const NamedParam* p = param_of.at(w.unsafeGetTensorImpl());
      const torch::Tensor v = (p->init ? p->drawn() : w.detach()).to(torch::kCPU, held_).contiguous();
      std::memcpy(dst, v.data_ptr(), static_cast<size_t>(v.numel()) * v.element_size());
      dst += static_cast<size_t>(v.numel()) * v.element_size();
    }
  });
  // The parameters re-pointed at their rows of the host copy (set_data reaches every holder):
  // read there, never copied again; a drawn one holds its values now.
  torch::NoGradGuard no_grad;
  for (const BaseGemm* g : order) {
    const Gemm& e = gemms_.at(g->id);
    const char* src = layers_->host_part(e.layer, e.part);
    for (torch::Tensor w : g->weights) {
      NamedParam& p = *param_of.at(w.unsafeGetTensorImpl());
      const auto bytes = static_cast<size_t>(w.numel()) * c10::elementSize(held_);
      // In the dtype held (as a resident frozen base holds it): a float32 placeholder of a bf16
      // base is not widened into a second, float32 copy of the base.
      w.set_data(torch::from_blob(const_cast<char*>(src), w.sizes(), torch::dtype(held_)));
      p.host_only = true;
      p.init = nullptr;
      src += bytes;
    }
  }
  // A drawn base's other matrices (an untied output layer) are drawn now, where the model holds
  // them: only the layers stream.
  for (NamedParam& p : model.params()) {
    if (p.group != 0 || !p.init) continue;
    p.tensor.set_data(p.drawn().to(held_));
    p.init = nullptr;
  }
  model.read_frozen_gemms(*this, gemms);
}

StreamedBase::~StreamedBase() {
  const offload::FrozenLayersStats s = layers_->stats();
  THETAD_LOG(info, "offload") << (layers_->sharded() ? "sharded base: " : "streamed base: ") << s.copies
                              << (layers_->sharded() ? " layer gathers (" : " layer copies (")
                              << s.copied_bytes / 1000000 << " MB), " << s.misses << " not prefetched";
}

torch::Tensor StreamedBase::acquire(int id, torch::ScalarType dtype, bool backward) {
  const Gemm& g = gemms_.at(id);
  char* slot = layers_->acquire(g.layer, backward ? -1 : 1);
  const torch::Tensor w = torch::from_blob(slot + layers_->part_offset(g.layer, g.part), {g.rows, g.cols},
                                           torch::dtype(held_).device(plane_.device));
  return dtype == held_ ? w : w.to(dtype);
}

void StreamedBase::done(int id) { layers_->release(gemms_.at(id).layer); }

}  // namespace thetad::daemon
