// Where the streamed trunk's layers go (see streamed_trunk.hpp), resolved once at build: how
// many of the lowest stay on the device with their Adam state (offload.shared_device_layers) and
// how many streamed ones are updated on the device through update lines
// (offload.shared_split_layers, from the step model of offload/update_split.hpp).
#include <algorithm>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "daemon/homes/streamed_trunk.hpp"
#include "offload/update_split.hpp"

namespace thetad::daemon {

// A count asks for it anywhere (the CPU build too: its tests compare the paths); auto on GPUs.
bool StreamedTrunk::wants_split() const {
  return job_.offload.shared_split_layer_count() > 0 || (job_.offload.shared_split_layers_auto() && plane_.gpu());
}

// The step model's input (offload/update_split.hpp): the streamed layers with their compute
// estimated from their FLOPs, the layers kept on the device around them. The same on every rank
// (the job, and bandwidths agreed over the ranks), so every rank picks the same count.
offload::StepInput StreamedTrunk::split_model_input(const offload::UpdateBandwidths& bw) const {
  // The device's rate on the trunk's matmuls: an H100 ran the benchmark's fp32 trunks (widths
  // 4096-8192, batch 1024) all-resident at 40-43 TFLOP/s; bf16 taken as 4x. A rough figure is
  // enough: on those shapes a rate 4x off either way picks a count no slower than none and within
  // 5% of the best (tests/offload/test_update_split.cpp), where the whole gain is ~3%.
  const bool bf16 = job_.precision == config::Precision::Bf16;
  const double flops = bf16 ? 160e12 : 40e12;
  constexpr double kDeviceAdamBytesPerSecond = 2e12;  // HBM, 28 B a parameter
  const double rows = static_cast<double>(job_.data.batch_per_rank * job_.accumulate_steps);
  const double act_dtype = bf16 ? 2 : 4;
  offload::StepInput in;
  in.bw = bw;
  in.prefetch = prefetch_;
  in.bf16_copies = job_.offload.h2d_dtype == config::H2dDtype::Bf16;
  in.device_adam_bps = kDeviceAdamBytesPerSecond;
  in.lowest_is_first = device_layers() == 0;
  for (int64_t l = 0; l < layers(); ++l) {
    const Layer& lp = layer_params_[static_cast<size_t>(l)];
    const auto& w = groups_[lp.w].tensor;  // [out, in]
    offload::LayerCost c;
    c.numel = lp.w_numel + lp.b_numel;
    c.fwd_s = 2 * rows * static_cast<double>(lp.w_numel) / flops;
    c.bwd_s = (l == 0 ? 1 : 2) * c.fwd_s;  // the first layer's input needs no gradient
    if (job_.offload.activations)  // x and z, in the compute dtype
      c.act_bytes = rows * static_cast<double>(w.size(0) + w.size(1)) * act_dtype;
    if (l >= device_layers()) {
      in.layers.push_back(c);
      continue;
    }
    in.before_s += c.fwd_s;
    in.after_s += c.bwd_s + 28.0 * static_cast<double>(c.numel) / kDeviceAdamBytesPerSecond;
  }
  return in;
}

// auto: the count with the shortest modelled step (offload/update_split.hpp) at the bandwidths
// measured now (the lowest over the ranks), over the streamed layers, lowest first.
void StreamedTrunk::resolve_split() {
  const int64_t streamed = layers() - device_layers();
  if (!job_.offload.shared_split_layers_auto()) {
    split_ = std::min(job_.offload.shared_split_layer_count(), streamed);
    return;
  }
  if (!wants_split()) return;
  const offload::UpdateBandwidths bw = store_->update_bandwidths();
  const offload::StepInput in = split_model_input(bw);
  std::vector<offload::StepModel> models;
  split_ = static_cast<int64_t>(offload::fastest_split(in, &models));
  if (split_ == 0) store_->drop_update_lines();  // a split of none needs none: 3 x prefetch + 2 layers' worth
  std::vector<size_t> numel;
  for (const offload::LayerCost& c : in.layers) numel.push_back(c.numel);
  const offload::SplitTimes none = offload::split_times(numel, 0, bw, in.bf16_copies),
                            chosen = offload::split_times(numel, static_cast<size_t>(split_), bw, in.bf16_copies);
  const auto ms = [](double s) { return s * 1e3; };
  const offload::StepModel& m = models[static_cast<size_t>(split_)];
  THETAD_LOG(info, "offload") << "offload.shared_split_layers auto: " << split_ << " of " << streamed
                              << " streamed layers updated on the device (PCIe " << bw.h2d / 1e9 << " GB/s in, "
                              << bw.d2h / 1e9 << " GB/s out, CPU AdamW " << bw.cpu_adam / 1e9
                              << " GB/s): modelled step " << ms(models.front().step_s) << " ms with none, "
                              << ms(m.step_s) << " with " << split_ << ", " << ms(models.back().step_s)
                              << " with all (busy with " << split_ << ": compute " << ms(m.compute_s) << ", to the device "
                              << ms(m.h2d_s) << ", back " << ms(m.d2h_s) << ", CPU AdamW " << ms(m.cpu_s)
                              << " ms); totals to the device, back, CPU AdamW " << ms(none.h2d_s) << ", "
                              << ms(none.d2h_s) << ", " << ms(none.cpu_s) << " ms with none, " << ms(chosen.h2d_s)
                              << ", " << ms(chosen.d2h_s) << ", " << ms(chosen.cpu_s) << " ms with " << split_;
}

size_t StreamedTrunk::device_cache_bytes() const { return static_cast<size_t>(device_layers()) * line_bytes(); }

size_t StreamedTrunk::line_bytes() const {
  size_t largest = 0;
  for (const Layer& l : layer_params_) largest = std::max(largest, l.w_numel + l.b_numel);
  return 3 * largest * sizeof(float);  // values, m, v
}

// offload.shared_device_layers: the count, or auto: as many layers as the device's free memory
// holds now (offload::auto_cache_bytes: less the margin device_cache_mb auto keeps), at most all
// but one; none on the CPU. Resolved once, before the θ[t] store reserves what is left.
int64_t StreamedTrunk::device_layers() const {
  if (device_layers_ >= 0) return device_layers_;
  device_layers_ = job_.offload.shared_device_layer_count();
  if (!job_.offload.shared_device_layers_auto() || !plane_.gpu()) return device_layers_;
  size_t avail =
      offload::auto_cache_bytes(
          *offload::make_cuda_device(plane_.device.index(), plane_.compute_stream, plane_.device_sharers));
  const size_t update_lines = wants_split() ? static_cast<size_t>(prefetch_ + 2) * line_bytes() : 0;
  avail = avail > update_lines ? avail - update_lines : 0;  // the split's lines come first
  device_layers_ = std::min<int64_t>(layers() - 1, static_cast<int64_t>(avail / line_bytes()));
  THETAD_LOG(info, "offload") << "offload.shared_device_layers auto: " << device_layers_ << " of " << layers()
                              << " trunk layers fit in the device's free memory less the margin (" << (avail >> 20)
                              << " MiB, " << line_bytes() << " bytes per layer)";
  return device_layers_;
}

}  // namespace thetad::daemon
