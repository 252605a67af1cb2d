// AutocastScope (see precision.hpp) over LibTorch's two autocast APIs: per-device-type functions
// from 2.4 on, separate CPU and CUDA ones before (1.13 on Debian).
#include "daemon/ops/precision.hpp"

#include <ATen/autocast_mode.h>
#include <torch/version.h>


#define THETAD_TORCH_AUTOCAST_BY_DEVICE (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4))

namespace thetad::daemon {
namespace {

bool autocast_enabled(torch::DeviceType type) {
#if THETAD_TORCH_AUTOCAST_BY_DEVICE
  return at::autocast::is_autocast_enabled(type);
#else
  return type == torch::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

void set_autocast(torch::DeviceType type, bool enabled, torch::ScalarType dtype) {
#if THETAD_TORCH_AUTOCAST_BY_DEVICE
  at::autocast::set_autocast_dtype(type, dtype);
  at::autocast::set_autocast_enabled(type, enabled);
#else
  if (type == torch::kCPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(enabled);
  }
#endif
}

torch::ScalarType autocast_dtype(torch::DeviceType type) {
#if THETAD_TORCH_AUTOCAST_BY_DEVICE
  return at::autocast::get_autocast_dtype(type);
#else
  return type == torch::kCPU ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
#endif
}

}  // namespace

AutocastScope::AutocastScope(config::Precision precision, const torch::Device& device) {
  if (precision != config::Precision::Bf16) return;
  on_ = true;
  type_ = device.type();
  was_enabled_ = autocast_enabled(type_);
  was_dtype_ = autocast_dtype(type_);
  set_autocast(type_, true, torch::kBFloat16);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!on_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_autocast(type_, was_enabled_, was_dtype_);
}

std::optional<torch::ScalarType> active_autocast_dtype(torch::DeviceType type) {
  if (!autocast_enabled(type)) return std::nullopt;
  return autocast_dtype(type);
}

torch::Tensor fp32_values(const torch::Tensor& t) {
  if (t.scalar_type() == torch::kFloat32) return t;
  return t.detach().to(torch::kCPU).to(torch::kFloat32);
}

}  // namespace thetad::daemon
