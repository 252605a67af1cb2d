// A rank that never comes to an agreement of every rank (stalled_agreement.sh runs this under
// mpirun with THETAD_TEST_STALL=<point>@1:<seconds>): the NCCL bootstrap's id exchange (no NCCL:
// its bytes are opaque), or the parameter store's device-cache agreement. The other ranks end as
// thetad does: TimeoutError naming the agreement on stderr, the job aborted with its exit code
// (3). Without the stall every rank gets through and exits 0.
//   stall_agreement nccl_id_exchange|cache_agreement TIMEOUT_S
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/bootstrap.hpp"
#include "comm/control_plane.hpp"
#include "common/errors.hpp"
#include "offload/device.hpp"
#include "offload/param_store.hpp"
#include "offload/util.hpp"

namespace {

void reach(const std::string& point, double timeout_s) {
  if (point == "nccl_id_exchange") {
    thetad::comm::ControlPlane plane(thetad::comm::make_mpi_communicator(), thetad::offload::timeout_of(timeout_s));
    const std::string id = thetad::comm::exchange_bootstrap_id(plane, [] { return std::string(128, 'x'); });
    if (id != std::string(128, 'x')) throw thetad::InternalError("the id arrived changed");
  } else if (point == "cache_agreement") {
    namespace off = thetad::offload;
    off::StoreOptions o;
    o.timeout_s = timeout_s;
    o.cache_bytes = 2 * 3 * 20 * sizeof(float);  // two lines: an agreement on their count
    off::HostDevice device;
    const auto every = [](int64_t) { return std::vector<int>{1, 2}; };
    off::ParamStore store(o, {{1, 10, 1}, {2, 20, 1}}, device, every, every);
    if (store.cache().cache_lines() != 2) throw thetad::InternalError("not two cache lines");
  } else {
    throw thetad::ConfigError("unknown point " + point);
  }
}

}  // namespace

int main(int argc, char** argv) {
  thetad::comm::MpiSession mpi(&argc, &argv);
  const thetad::comm::WorldInfo w = thetad::comm::world_info();
  if (argc != 3) {
    std::fprintf(stderr, "usage: stall_agreement nccl_id_exchange|cache_agreement TIMEOUT_S\n");
    return 2;
  }
  try {
    reach(argv[1], std::atof(argv[2]));
  } catch (const thetad::TimeoutError& e) {
    std::fprintf(stderr, "rank %d: TimeoutError: %s (exit %d)\n", w.rank, e.what(), e.exit_code());
    thetad::comm::abort_job(e.exit_code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s (exit %d)\n", w.rank, e.what(), thetad::exit_code_for(e));
    thetad::comm::abort_job(thetad::exit_code_for(e));
  }
  std::printf("rank %d: through %s\n", w.rank, argv[1]);
  return 0;
}
