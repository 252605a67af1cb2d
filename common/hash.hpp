// The splitmix64 finaliser: the one 64-bit mixer of thetad (the weighted schedule's
// counter-based RNG, the models' seed mixing). Header-only, no dependencies.
#pragma once

#include <cstdint>

namespace thetad {

constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace thetad
