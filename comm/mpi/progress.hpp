// The MPI backend's progress thread: the queue of operations not yet posted, the requests in
// flight, and the one thread that posts them in submission order and polls them with
// MPI_Testsome (MpiCommunicator's collectives, sends and receives).
//
// Nonblocking collectives must be posted in the same order on every rank, so only this thread
// posts them, in queue order. It also is the only thread that tests them: MPI progresses
// nonblocking operations only inside MPI calls, and a thread that polls keeps the reduction of
// one bucket going while backward computes the next.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi/work.hpp"

namespace thetad::comm {

class MpiProgress : public std::enable_shared_from_this<MpiProgress> {
 public:
  struct Op {
    std::shared_ptr<MpiWork> work;
    // Posts the operation's requests, appended to `reqs` (one for a collective, one per send or
    // receive of an exchange); returns an MPI error code.
    std::function<int(std::vector<MPI_Request>& reqs)> post;
    std::function<void()> finish;  // after every request completed (the divisor), may be empty
  };
  // An Op of one request.
  static Op single(std::shared_ptr<MpiWork> work, std::function<int(MPI_Request*)> post,
                   std::function<void()> finish = {});

  void start();
  void submit(Op op);
  // Fails every queued and in-flight work with `error`; later submissions fail at once.
  // Requests already posted stay with the thread, which keeps testing them until it stops.
  void abort(const std::string& why, std::exception_ptr error);
  bool aborted();
  // Returns whether every posted request finished (if not, they are leaked: the communicator
  // they belong to must then not be freed).
  bool stop();

 private:
  // How long a thread that made no progress sleeps before testing again; short, because the
  // caller may be waiting for exactly this bucket, and a submit wakes it at once anyway.
  static constexpr std::chrono::microseconds kIdlePoll{50};
  // After stop, how long requests still in flight (after an abort) are given to drain.
  static constexpr std::chrono::milliseconds kDrain{2000};

  // A posted operation: its requests still pending, and whether posting it failed (then the
  // requests it did post are only drained).
  struct Posted {
    Op op;
    size_t remaining = 0;
    bool failed = false;
  };

  void run();
  void post(Op& op);
  bool test();  // whether any request finished
  void track_inflight();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;                            // guarded by mu_
  std::vector<std::shared_ptr<MpiWork>> inflight_;  // guarded by mu_ (for abort)
  bool aborted_ = false;                            // guarded by mu_
  bool stop_ = false;                               // guarded by mu_
  std::string why_;
  // Only the progress thread touches these: the requests in flight and, for each, its operation.
  std::vector<MPI_Request> reqs_;
  std::vector<std::shared_ptr<Posted>> owner_;
  std::vector<int> indices_;
  std::thread thread_;
};

// A work whose timed-out wait aborts `progress` with the TimeoutError itself, so every other
// waiter sees the same error.
std::shared_ptr<MpiWork> new_mpi_work(const std::shared_ptr<MpiProgress>& progress, uint64_t sequence,
                                      CollectiveTag tag);

}  // namespace thetad::comm
