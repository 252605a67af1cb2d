// A PyTorch profiler trace (Kineto: host operators and, on GPUs, every kernel and copy with its
// device time) of a span of steps, for finding where a step's device time goes: with
// THETAD_DEVICE_PROFILE=FIRST:LAST:PATH in the environment, rank 0 records steps FIRST..LAST and
// writes a Chrome trace to PATH (bench/gpu/kernel_summary.py sums it by kernel). Off otherwise.
// A developer's tool (docs/gpu.md), not a job key: it slows the steps it records.
#pragma once

#include <cstdint>
#include <exception>
#include <string>

namespace thetad::daemon {

class DeviceProfile {
 public:
  explicit DeviceProfile(int rank);
  ~DeviceProfile();
  DeviceProfile(const DeviceProfile&) = delete;
  DeviceProfile& operator=(const DeviceProfile&) = delete;

  void before_step(int64_t step);
  // After the step's work is queued: the last recorded step waits for the device, then the trace
  // is written.
  void after_step(int64_t step);

 private:
  void refuse(const std::exception& e);

  int64_t first_ = -1, last_ = -1;
  std::string path_;
  bool on_ = false;
};

}  // namespace thetad::daemon
