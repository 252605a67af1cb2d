// The profiler trace of a span of steps (see device_profile.hpp).
#include "daemon/train/device_profile.hpp"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <cstdlib>
#include <set>

#include "common/errors.hpp"
#include "common/log.hpp"

namespace thetad::daemon {
namespace {

using torch::profiler::impl::ActivityType;

std::set<ActivityType> traced_activities() {
  std::set<ActivityType> a{ActivityType::CPU};
  if (torch::cuda::is_available()) a.insert(ActivityType::CUDA);
  return a;
}

torch::profiler::impl::ProfilerConfig kineto_config() {
  return torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::KINETO);
}

}  // namespace

DeviceProfile::DeviceProfile(int rank) {
  const char* spec = std::getenv("THETAD_DEVICE_PROFILE");
  if (rank != 0 || spec == nullptr || *spec == '\0') return;
  const std::string s(spec);
  const size_t a = s.find(':'), b = a == std::string::npos ? a : s.find(':', a + 1);
  char* end = nullptr;
  if (b != std::string::npos) {
    first_ = std::strtoll(s.c_str(), &end, 10);
    last_ = end == s.c_str() + a ? std::strtoll(s.c_str() + a + 1, &end, 10) : -1;
    path_ = s.substr(b + 1);
  }
  THETAD_CHECK(b != std::string::npos && end == s.c_str() + b && first_ >= 0 && last_ >= first_ && !path_.empty(),
               ConfigError, "THETAD_DEVICE_PROFILE: '", s, "' is not FIRST:LAST:PATH (steps FIRST <= LAST)");
  try {
    torch::autograd::profiler::prepareProfiler(kineto_config(), traced_activities());
  } catch (const std::exception& e) {
    refuse(e);
  }
}

// A LibTorch built without Kineto (Debian's) cannot trace: the run goes on without one.
void DeviceProfile::refuse(const std::exception& e) {
  const std::string what = e.what();
  THETAD_LOG(warn, "train") << "THETAD_DEVICE_PROFILE: no trace (" << what.substr(0, what.find('\n')) << ")";
  first_ = last_ = -1;
  on_ = false;
}

DeviceProfile::~DeviceProfile() {
  if (!on_) return;
  try {
    torch::autograd::profiler::disableProfiler();
  } catch (...) {  // unwinding already: the trace is lost, the error that stopped the run is not
  }
}

void DeviceProfile::before_step(int64_t step) {
  if (step != first_) return;
  try {
    torch::autograd::profiler::enableProfiler(kineto_config(), traced_activities());
    on_ = true;
  } catch (const std::exception& e) {
    refuse(e);
  }
}

void DeviceProfile::after_step(int64_t step) {
  if (!on_ || step != last_) return;
  if (torch::cuda::is_available()) torch::cuda::synchronize();
  on_ = false;
  try {
    torch::autograd::profiler::disableProfiler()->save(path_);
    THETAD_LOG(info, "train") << "THETAD_DEVICE_PROFILE: steps " << first_ << ".." << last_ << " written to " << path_;
  } catch (const std::exception& e) {
    refuse(e);
  }
}

}  // namespace thetad::daemon
