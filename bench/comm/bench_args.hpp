// The command line of the comm benchmarks (bench_engine_bw, bench_comm_bw): `--key value` pairs,
// each handed to `set(key, value)`, which returns false for a key it does not know; `usage(why)`
// (which must not return) on an unknown key, a missing value or a value that does not parse.
// Also the median, over iterations, of the slowest rank's time.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/mpi_check.hpp"

namespace thetad::bench {

inline void parse_flags(int argc, char** argv, const std::function<void(const std::string&)>& usage,
                        const std::function<bool(const std::string&, const std::string&)>& set) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") usage("help");
    if (i + 1 >= argc) usage(k + " needs a value");
    const std::string v = argv[++i];
    try {
      if (!set(k, v)) usage("unknown argument '" + k + "'");
    } catch (const std::invalid_argument&) {
      usage("bad value for " + k);
    } catch (const std::out_of_range&) {
      usage("bad value for " + k);
    }
  }
}

// Every rank's times of the same iterations: the median of their maxima (collective).
inline double median_of_slowest(const std::vector<double>& times) {
  std::vector<double> worst(times.size());
  MPI_CHECK(MPI_Allreduce(times.data(), worst.data(), static_cast<int>(times.size()), MPI_DOUBLE, MPI_MAX,
                          MPI_COMM_WORLD));
  std::sort(worst.begin(), worst.end());
  const size_t n = worst.size();
  return n % 2 ? worst[n / 2] : 0.5 * (worst[n / 2 - 1] + worst[n / 2]);
}

}  // namespace thetad::bench
