// The control plane: how every rank of a group learns the same thing. Small host-side
// agreements (over MPI, never over the GPU's queue), each bounded by a timeout and named by a
// CollectiveTag, so that a stalled or dead peer ends in "TimeoutError: <what> at step s did
// not finish within 300 s" instead of a hang. One instance per group of ranks: the job's world
// (the trainer: job and plan checks, checkpoints, resume, the stop agreement) and a node (the
// host arena: memory reading and pinning agreement).
//
//   ControlPlane ctrl(make_mpi_communicator(), timeout);
//   ctrl.check_consistent("job", fingerprint);                 // same text on every rank, or ConfigError
//   if (!ctrl.all_ok(wrote_my_files, {"checkpoint files", step})) ...
//   int64_t s = ctrl.run_on_root(0, {"resume step"}, [&] { return newest_step(); });
//   int64_t lines = ctrl.min({mine}, {"device cache lines"})[0];        // the fewest any rank has
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace thetad::comm {

class ControlPlane {
 public:
  // `comm` must hold host memory (an MPI communicator); every rank of it must make the same
  // calls in the same order.
  ControlPlane(std::shared_ptr<Communicator> comm, std::chrono::milliseconds timeout = kDefaultTimeout);

  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  std::chrono::milliseconds timeout() const { return timeout_; }
  Communicator& communicator() { return *comm_; }

  // Whether every rank passed ok = true. Every rank gets the same answer.
  bool all_ok(bool ok, const CollectiveTag& what);
  // all_ok over failures: `error` is this rank's (null: it succeeded). Where any rank failed,
  // every rank throws: the lowest failing rank rethrows its own exception, the others an
  // exception of the same kind (ConfigError, CommError, else Error) whose message is
  // "<what> failed on rank r: <its message>".
  void agree(std::exception_ptr error, const CollectiveTag& what);
  // Root's value (or text) on every rank.
  int64_t broadcast(int64_t value, int root, const CollectiveTag& what);
  std::string broadcast(std::string text, int root, const CollectiveTag& what);
  // Runs `work` on `root` only. Every rank returns its result, or, where it threw there, every
  // rank throws as agree() says.
  int64_t run_on_root(int root, const CollectiveTag& what, const std::function<int64_t()>& work);
  // Every rank holds the same text (one "key=value" or one bucket per line), or every rank
  // throws the same ConfigError naming the first rank and line that differ from rank 0's,
  // e.g. "job differs across ranks: rank 1 has 'optimizer.lr=0.002' where rank 0 has
  // 'optimizer.lr=0.001'". Hashes first: the common case costs 8 bytes per rank.
  void check_consistent(const std::string& what, const std::string& canonical_lines);
  void barrier(const CollectiveTag& what);
  // Element-wise the lowest (highest) of every rank's values; every rank passes as many values
  // and gets the same result. Exact for doubles (their bits travel, each rank reduces alike).
  std::vector<int64_t> min(std::vector<int64_t> values, const CollectiveTag& what);
  std::vector<int64_t> max(std::vector<int64_t> values, const CollectiveTag& what);
  std::vector<double> min(std::vector<double> values, const CollectiveTag& what);
  std::vector<double> max(std::vector<double> values, const CollectiveTag& what);

  // An agreement that does not block: post() sends this rank's flag, get() (later) tells
  // whether any rank raised its own. The pipelined stop agreement: step s posts, step s+1
  // reads, so no step waits for the slowest rank's host.
  class AnyFlag {
   public:
    AnyFlag() = default;
    AnyFlag(AnyFlag&&) = default;
    AnyFlag& operator=(AnyFlag&& o) noexcept;
    // A flag still in flight (an error unwound the loop) keeps its buffer: the collective may
    // still write into it.
    ~AnyFlag();
    bool pending() const { return work_ != nullptr; }
    bool get();  // blocks (bounded by the plane's timeout); false where nothing was posted
   private:
    friend class ControlPlane;
    void keep_if_in_flight() noexcept;
    WorkPtr work_;
    std::chrono::milliseconds timeout_{0};
    std::shared_ptr<int32_t> flag_;
  };
  AnyFlag post_any(bool flag, const CollectiveTag& what);

  // Every rank's words, rank by rank, without blocking: post_gather() sends this rank's (every
  // rank passes as many), get() (later) returns size() x words.size() of them. Small per-step
  // records (the step's per-task losses to rank 0's metrics) that ride beside other agreements.
  class Gathered {
   public:
    Gathered() = default;
    Gathered(Gathered&&) = default;
    Gathered& operator=(Gathered&&) = delete;
    // Still in flight (an error unwound the caller): its buffers stay allocated (see AnyFlag).
    ~Gathered();
    bool posted() const { return work_ != nullptr || buffers_ != nullptr; }
    // Whether get() would return at once.
    bool ready() const;
    // Blocks (bounded by the plane's timeout); rethrows the collective's failure.
    const std::vector<int64_t>& get();

   private:
    friend class ControlPlane;
    struct Buffers {
      std::vector<int64_t> send, recv;
    };
    WorkPtr work_;
    std::chrono::milliseconds timeout_{0};
    std::shared_ptr<Buffers> buffers_;
  };
  Gathered post_gather(std::vector<int64_t> words, const CollectiveTag& what);

 private:
  // Every rank's values, rank by rank (size() x values.size()).
  std::vector<int64_t> gather(const std::vector<int64_t>& values, const CollectiveTag& what);
  template <typename T, typename Pick>
  std::vector<T> reduce(std::vector<T> values, const CollectiveTag& what, Pick pick);

  std::shared_ptr<Communicator> comm_;
  std::chrono::milliseconds timeout_;
};

}  // namespace thetad::comm
