// The MPI backend of NodeMemory (see node_memory.hpp): the node's ranks as a communicator of their
// own (split_node), a control plane over a duplicate of it, and the segment as an MPI shared-memory
// window (MPI_Win_allocate_shared: local rank 0 allocates it all, the others 0 bytes, and every
// rank maps rank 0's part through MPI_Win_shared_query).
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "comm/control_plane.hpp"
#include "comm/mpi/mpi_communicator.hpp"
#include "comm/mpi_check.hpp"
#include "comm/node_memory.hpp"
#include "comm/mpi/node_comm.hpp"
#include "common/errors.hpp"
#include "common/leak_on_purpose.hpp"

namespace thetad::comm {
namespace {

std::atomic<bool> g_abandoned{false};

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

class MpiNodeMemory final : public NodeMemory {
 public:
  explicit MpiNodeMemory(std::chrono::milliseconds timeout) : node_(split_node(MPI_COMM_WORLD)) {
    try {
      MPI_CHECK(MPI_Comm_set_errhandler(node_, MPI_ERRORS_RETURN));
      MPI_CHECK(MPI_Comm_rank(node_, &rank_));
      MPI_CHECK(MPI_Comm_size(node_, &size_));
      // A private duplicate of node_: the agreements never mix with the window's collectives.
      plane_ = std::make_unique<ControlPlane>(std::make_shared<MpiCommunicator>(node_), timeout);
    } catch (...) {
      MPI_CHECK_NOTHROW(MPI_Comm_free(&node_));
      throw;
    }
  }

  ~MpiNodeMemory() override {
    release();
    if (node_memory_abandoned()) {
      (void)leak_on_purpose(plane_.release());  // its communicator too: freeing it may wait for failed ranks
      return;
    }
    plane_.reset();
    MPI_CHECK_NOTHROW(MPI_Comm_free(&node_));
  }

  int local_rank() const override { return rank_; }
  int local_size() const override { return size_; }
  ControlPlane& plane() override { return *plane_; }
  size_t allocated_here() const override { return allocated_; }

  char* allocate(size_t bytes) override {
    THETAD_CHECK(win_ == MPI_WIN_NULL, InternalError, "node memory: a segment is allocated already");
    // Local rank 0 allocates everything plus the slack that aligns the start; the others map it.
    const size_t mine = rank_ == 0 ? bytes + kSegmentAlign : 0;
    void* own = nullptr;
    if (MPI_Win_allocate_shared(static_cast<MPI_Aint>(mine), 1, MPI_INFO_NULL, node_, &own, &win_) != MPI_SUCCESS) {
      win_ = MPI_WIN_NULL;
      return nullptr;
    }
    allocated_ = mine;
    MPI_Aint size0 = 0;
    int disp = 1;
    void* base0 = nullptr;
    MPI_CHECK(MPI_Win_shared_query(win_, 0, &size0, &disp, &base0));
    return reinterpret_cast<char*>(round_up(reinterpret_cast<uintptr_t>(base0), kSegmentAlign));
  }

  void release() noexcept override {
    if (win_ == MPI_WIN_NULL || node_memory_abandoned()) return;
    MPI_CHECK_NOTHROW(MPI_Win_free(&win_));
    win_ = MPI_WIN_NULL;
    allocated_ = 0;
  }

 private:
  MPI_Comm node_ = MPI_COMM_NULL;
  std::unique_ptr<ControlPlane> plane_;
  MPI_Win win_ = MPI_WIN_NULL;
  size_t allocated_ = 0;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<NodeMemory> make_node_memory(std::chrono::milliseconds timeout) {
  return std::make_unique<MpiNodeMemory>(timeout);
}

void abandon_node_memory() noexcept { g_abandoned.store(true); }

bool node_memory_abandoned() noexcept { return g_abandoned.load(); }

}  // namespace thetad::comm
