// nccl-tests' bandwidth of a collective, the one formula the probe (bench/comm) and the engine's
// per-step record share: algbw = bytes / time, where bytes is what one rank's result holds (the
// whole buffer of an allreduce or a broadcast, all size() blocks of an all-gather or of a
// reduce-scatter's input, the message of a send); busbw = algbw x a factor that makes every kind
// comparable with the links' speed (allreduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n,
// broadcast and send/recv 1).
#pragma once

#include <cstdint>

namespace thetad::comm {

enum class CollectiveKind { allreduce, broadcast, reduce_scatter, allgather, sendrecv };

inline double bus_factor(CollectiveKind kind, int ranks) {
  const double n = ranks;
  switch (kind) {
    case CollectiveKind::allreduce: return ranks > 1 ? 2.0 * (n - 1) / n : 0.0;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::allgather: return ranks > 1 ? (n - 1) / n : 0.0;
    case CollectiveKind::broadcast:
    case CollectiveKind::sendrecv: return 1.0;
  }
  return 1.0;
}

// GB/s (1e9 bytes) of `bytes` in `ms` milliseconds; 0 when nothing was timed.
inline double algbw_gbs(double bytes, double ms) { return ms > 0 ? bytes / (ms * 1e6) : 0.0; }

}  // namespace thetad::comm
