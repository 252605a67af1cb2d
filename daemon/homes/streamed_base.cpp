// The transformer's frozen base streamed from host memory or gathered from the node's shards
// (see streamed_base.hpp).
#include "daemon/homes/streamed_base.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "comm/node_memory.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "daemon/models/quantized_base.hpp"
#include "daemon/ops/precision.hpp"
#include "offload/util.hpp"

namespace thetad::daemon {
namespace {

int64_t rows_of(const BaseGemm& g) {
  int64_t rows = 0;
  for (const torch::Tensor& w : g.weights) rows += w.size(0);
  return rows;
}

int64_t blocks_of(int64_t rows, int64_t cols) { return (rows * cols + kNf4Block - 1) / kNf4Block; }

void copy_bytes(char* dst, const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kCPU).contiguous();
  std::memcpy(dst, c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
}

}  // namespace

StreamedBase::StreamedBase(const config::Job& job, const Placement& placement, TaskModel& model,
                           const DataPlane& plane)
    : plane_(plane),
      held_(placement.frozen_base_bf16 ? torch::kBFloat16 : torch::kFloat32),
      nf4_(job.model.base_quant == config::BaseQuant::Nf4) {
  std::vector<BaseGemm> gemms = model.frozen_gemms();
  std::map<const c10::TensorImpl*, NamedParam*> param_of;
  for (NamedParam& p : model.params()) param_of[p.tensor.unsafeGetTensorImpl()] = &p;
  // Layers in order, each layer's GEMMs in the model's order: a layer is one copy. A GEMM is one
  // part (its matrix in the GEMMs' dtype) or, in nf4, two (its codes, then its absmax).
  std::vector<std::vector<size_t>> parts;
  std::map<std::pair<int, int>, const BaseGemm*> at;  // (layer, first part) -> its GEMM
  for (const BaseGemm& g : gemms) {
    if (g.layer < 0) continue;
    if (static_cast<size_t>(g.layer) >= parts.size()) parts.resize(static_cast<size_t>(g.layer) + 1);
    std::vector<size_t>& layer = parts[static_cast<size_t>(g.layer)];
    const int64_t rows = rows_of(g), cols = g.weights.front().size(1);
    gemms_[g.id] = {g.layer, static_cast<int>(layer.size()), rows, cols};
    at[{g.layer, static_cast<int>(layer.size())}] = &g;
    if (nf4_) {
      const auto blocks = static_cast<size_t>(blocks_of(rows, cols));
      layer.push_back(blocks * kNf4Block / 2);
      layer.push_back(blocks * static_cast<size_t>(kNf4AbsmaxBytes));
      scratch_.reserve(rows * cols);
    } else {
      layer.push_back(static_cast<size_t>(rows * cols) * c10::elementSize(held_));
    }
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
  // Each GEMM's values as the model holds them (a placeholder drawn as the model would draw it),
  // in the GEMMs' dtype, its weights' rows joined; in nf4 the codes and absmax the resident nf4
  // base holds (quantize_gemm, on the rank's device), the absmax kept from its codes' part to its
  // own (a layer's parts are written in order, by one thread).
  const DrawnParams drawn = drawn_params(model.params());
  std::mutex absmax_mutex;
  std::map<std::pair<int, int>, torch::Tensor> absmax_of;
  layers_->fill([&](int layer, int part, char* dst) {
    torch::NoGradGuard no_grad;
    if (nf4_ && part % 2 == 1) {
      std::lock_guard<std::mutex> lock(absmax_mutex);
      const auto it = absmax_of.find({layer, part - 1});
      copy_bytes(dst, it->second);
      absmax_of.erase(it);
      return;
    }
    const BaseGemm& g = *at.at({layer, part});
    if (nf4_) {
      const Nf4Matrix m = quantize_gemm(g, drawn, plane_.device, held_);
      copy_bytes(dst, m.codes);
      std::lock_guard<std::mutex> lock(absmax_mutex);
      absmax_of[{layer, part}] = m.absmax;
      return;
    }
    for (const torch::Tensor& w : g.weights) {
      const NamedParam* p = param_of.at(w.unsafeGetTensorImpl());
      const torch::Tensor v = (p->init ? p->drawn() : w.detach()).to(torch::kCPU, held_).contiguous();
      copy_bytes(dst, v);
      dst += static_cast<size_t>(v.numel()) * v.element_size();
    }
  });
  hold_parameters(gemms, param_of);
  // A drawn base's other matrices (an untied output layer not quantized) are drawn now, where the
  // model holds them: only the layers stream.
  for (NamedParam& p : model.params()) {
    if (p.group != 0 || !p.init || p.host_only) continue;
    p.tensor.set_data(p.drawn().to(held_));
    p.init = nullptr;
  }
  model.read_frozen_gemms(*this, gemms);
}

// The parameters the layers came from, held where checkpoints, the final hash and the merged
// export read them (host_only). In the GEMMs' dtype: re-pointed at their rows of the host copy
// (set_data reaches every holder), never copied again, a drawn one holding its values now, in the
// dtype held (as a resident frozen base holds it: a float32 placeholder of a bf16 base is not
// widened into a second copy of the base). In nf4 the host copy is codes: a parameter read from
// files keeps its values in host memory, a placeholder stays one (drawn again where it is read),
// as for a resident nf4 base.
void StreamedBase::hold_parameters(const std::vector<BaseGemm>& gemms,
                                   const std::map<const c10::TensorImpl*, NamedParam*>& param_of) {
  torch::NoGradGuard no_grad;
  for (const BaseGemm& g : gemms) {
    if (g.layer < 0) continue;
    const Gemm& e = gemms_.at(g.id);
    const char* src = layers_->host_part(e.layer, e.part);
    for (torch::Tensor w : g.weights) {
      NamedParam& p = *param_of.at(w.unsafeGetTensorImpl());
      p.host_only = true;
      if (nf4_) continue;
      w.set_data(torch::from_blob(const_cast<char*>(src), w.sizes(), torch::dtype(held_)));
      p.init = nullptr;
      src += static_cast<size_t>(w.numel()) * c10::elementSize(held_);
    }
  }
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
  const auto on = torch::TensorOptions().device(plane_.device);
  if (nf4_) {
    const int64_t blocks = blocks_of(g.rows, g.cols);
    Nf4Matrix m;
    m.codes = torch::from_blob(slot + layers_->part_offset(g.layer, g.part), {blocks * kNf4Block / 2}, on.dtype(torch::kUInt8));
    m.absmax = torch::from_blob(slot + layers_->part_offset(g.layer, g.part + 1), {blocks}, on.dtype(torch::kBFloat16));
    m.rows = g.rows;
    m.cols = g.cols;
    return nf4_dequantize(m, dtype, scratch_.get(m.numel(), dtype, plane_.device));
  }
  const torch::Tensor w = torch::from_blob(slot + layers_->part_offset(g.layer, g.part), {g.rows, g.cols}, on.dtype(held_));
  return dtype == held_ ? w : w.to(dtype);
}

void StreamedBase::done(int id) { layers_->release(gemms_.at(id).layer); }

}  // namespace thetad::daemon
