// What offload.uncached_update: auto weighs (offload/device_cache.hpp): the pinned host <-> device
// copy bandwidths and the CPU AdamW's, measured on this rank at the sizes the store moves (one
// group's parameters per copy, one group per AdamW call), on scratch memory of its own.
#pragma once

#include <cstddef>

#include "offload/device.hpp"
#include "offload/device_cache.hpp"

namespace thetad::offload {

// device_buf: device memory of at least `numel` floats that nothing reads or writes meanwhile
// (a free transit line); numel: a group's parameters (the largest the cache holds). Takes tens
// of milliseconds: up to 64 MiB of copies each way and 16 M parameters of AdamW, three times.
UpdateBandwidths probe_bandwidths(Device& device, void* device_buf, size_t numel);

}  // namespace thetad::offload
