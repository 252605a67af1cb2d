// This host's available memory, as the host arena (host_arena.cpp, where it is defined) and the
// job's memory estimate (daemon/plan/memory_estimate.cpp) read it.
#pragma once

#include <cstdint>

namespace thetad::offload {

// MemAvailable from /proc/meminfo in bytes; 0 when unknown.
uint64_t mem_available_bytes();

}  // namespace thetad::offload
