// The Communicator: a small asynchronous collective interface over raw buffers, implemented by
// comm/mpi/ (host buffers) and comm/nccl/ (device buffers). No LibTorch here.
//
//   auto work = comm.allreduce(buf, n, DType::f32, {.op = ReduceOp::sum, .tag = {"bucket", step, 3}});
//   ... compute ...
//   work->wait(comm.default_timeout());   // rethrows the collective's failure (CommError/TimeoutError)
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace thetad::comm {

enum class DType { f32, i32, bf16, i64, u8 };
enum class ReduceOp { sum, max };
size_t dtype_size(DType t);
const char* dtype_name(DType t);

// Names a collective in errors and timelines: "allreduce of bucket 3 at step 17".
struct CollectiveTag {
  std::string what = "collective";
  int64_t step = -1;
  int bucket = -1;
  std::string describe() const;
};

// `tag` named `op` ("allreduce", "barrier") when its caller gave it no name of its own.
CollectiveTag named(CollectiveTag tag, const char* op);
// "collective #12 (allreduce of bucket 3 at step 17)": a collective in errors, with the number
// its communicator gave it (Work::sequence; 0: unnumbered, then just the tag).
std::string describe_collective(uint64_t sequence, const CollectiveTag& tag);
// "collective #12 (allreduce of bucket 3 at step 17) did not finish within 2 s": every backend's
// timeout message.
std::string timeout_message(uint64_t sequence, const CollectiveTag& tag, std::chrono::milliseconds timeout);
// "300 s", "2 s", "0.5 s": timeouts as users wrote them.
std::string format_seconds(std::chrono::milliseconds ms);

constexpr std::chrono::milliseconds kDefaultTimeout{300'000};

// An asynchronous operation. Thread-safe.
class Work {
 public:
  virtual ~Work() = default;
  virtual bool is_completed() = 0;
  // Blocks the calling thread until done; rethrows the failure; throws TimeoutError after
  // `timeout` (the communicator is then aborted: a timed-out collective cannot be resumed).
  virtual void wait(std::chrono::milliseconds timeout) = 0;
  // Device backends: make `stream` (a cudaStream_t) wait for completion without blocking the
  // host. Host backends: same as wait().
  virtual void block_stream(void* stream, std::chrono::milliseconds timeout) { (void)stream; wait(timeout); }
  // Milliseconds the operation took, once completed, else -1: host backends from submission to
  // completion; NCCL on the device, from the moment its stream reached the operation (after the
  // compute it waited for) to its end, so that bytes / elapsed is the bandwidth it achieved.
  virtual double elapsed_ms() const { return -1.0; }
  // Its number among its communicator's collectives, 1, 2, 3... in launch order (0: unnumbered),
  // so that a timeout names "collective #N" and ranks' logs can be lined up.
  virtual uint64_t sequence() const { return 0; }
};
using WorkPtr = std::shared_ptr<Work>;
// A Work that is complete from the start (an operation done where it was called), carrying its
// collective's number where it has one (0: none).
WorkPtr completed_work(uint64_t sequence = 0);

struct AllreduceOptions {
  ReduceOp op = ReduceOp::sum;
  // After the sum, every element is divided by this (1 = none). NCCL applies 1/divisor as a
  // PreMulSum; MPI divides once the sum has arrived.
  double divisor = 1.0;
  CollectiveTag tag;
  // Device backends: order the collective after the work queued on the compute stream. The
  // engine's count exchange turns it off: it reads no gradients, so it must not wait for forward.
  bool after_compute = true;
  // >= 0: only this rank's buffer can be nonzero (the engine's bucket of a group one rank used),
  // so the result is that buffer / divisor on every rank, and the backend broadcasts it from
  // that rank instead of summing: a ring broadcast puts each byte on a link once, a ring
  // allreduce 2(n-1)/n times. Sum only; the result equals the allreduce's bit for bit.
  int from_root = -1;
  // A float32 sum sent as bfloat16 (half the bytes; DDP's bf16 compress hook). Each rank's
  // buffer is multiplied by float(1/divisor) and rounded to bf16 (nearest even) in memory of the
  // backend's own, so that a sum overflows only where the average would; the bf16 sum (each
  // addition rounded to bf16) is written back into `buf` as float32. With from_root the root's
  // rounded values are sent. Only for f32 sums.
  bool bf16_wire = false;
};

// One side of a point-to-point transfer (Communicator::exchange): `count` elements of `dtype` at
// `buf` sent to `peer` (read) or received from it (written).
struct PeerOp {
  enum class Kind { send, recv };
  Kind kind = Kind::send;
  int peer = 0;
  void* buf = nullptr;
  size_t count = 0;
  DType dtype = DType::f32;
};
PeerOp send_op(const void* buf, size_t count, DType dtype, int peer);
PeerOp recv_op(void* buf, size_t count, DType dtype, int peer);
// Every backend's check of an exchange's ops on rank `rank` of `size` (InternalError naming the
// tag): peers are other ranks, buffers are given.
void check_peer_ops(const std::vector<PeerOp>& ops, int rank, int size, const CollectiveTag& tag);

// Where a communicator's buffers live.
enum class MemoryKind { host, device };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual MemoryKind memory_kind() const = 0;
  virtual const char* backend_name() const = 0;
  // Whether collectives complete in launch order (one device stream): then making a stream
  // wait for the last one also orders it after every earlier one.
  virtual bool completes_in_order() const { return false; }
  std::chrono::milliseconds default_timeout() const { return timeout_; }
  void set_default_timeout(std::chrono::milliseconds t) { timeout_ = t; }

  // All in place unless stated; buffers must stay valid until the work completes.
  virtual WorkPtr allreduce(void* buf, size_t count, DType dtype, const AllreduceOptions& opts) = 0;
  virtual WorkPtr broadcast(void* buf, size_t count, DType dtype, int root, const CollectiveTag& tag) = 0;
  // recv holds size() * count elements, rank r's contribution at r * count.
  virtual WorkPtr allgather(const void* send, void* recv, size_t count, DType dtype,
                            const CollectiveTag& tag) = 0;
  // `send` holds size() * count elements; rank r's `recv` gets the reduction (`op`) over the ranks
  // of their elements [r * count, (r + 1) * count). bf16 sums round each addition.
  virtual WorkPtr reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                 const CollectiveTag& tag) = 0;
  // Point-to-point: the sends and receives of `ops`, posted together (NCCL: one group call, so a
  // rank may send to and receive from the same peer without deadlock; MPI: nonblocking sends and
  // receives), complete as one Work, bounded by the timeout like a collective. Each op must meet
  // its peer's opposite op of the same count and dtype; the transfers between two ranks match in
  // the order both post them, so every rank must issue its exchanges at the same point of its
  // sequence of collectives. Ranks not named by any op take no part. A peer may not be this rank.
  virtual WorkPtr exchange(const std::vector<PeerOp>& ops, const CollectiveTag& tag) = 0;
  WorkPtr send(const void* buf, size_t count, DType dtype, int peer, const CollectiveTag& tag) {
    return exchange({send_op(buf, count, dtype, peer)}, tag);
  }
  WorkPtr recv(void* buf, size_t count, DType dtype, int peer, const CollectiveTag& tag) {
    return exchange({recv_op(buf, count, dtype, peer)}, tag);
  }
  virtual WorkPtr barrier(const CollectiveTag& tag) = 0;
  // No collective: a Work that completes once the work queued on the compute stream so far has
  // (device backends: an event after it on the communication stream; host backends: complete
  // now, the host computed it). The engine's adopted buckets (a world of one) hand it to their
  // consumers, which order themselves after the gradients as after a reduction.
  virtual WorkPtr after_compute(const CollectiveTag& tag);
  // Tears the communicator down so that no call blocks any more (after a timeout or a fatal error).
  virtual void abort(const std::string& why) = 0;

  // Device backends order collectives after work already queued on this stream (cudaStream_t).
  virtual void set_compute_stream(void* stream) { (void)stream; }

  // Memory for buffers of this communicator's kind, zero-initialized.
  virtual std::shared_ptr<void> allocate(size_t bytes) = 0;
  // Sets `bytes` at `ptr` to zero (device backends: asynchronously on the compute stream).
  virtual void zero(void* ptr, size_t bytes) = 0;
  // Divides `count` floats at `buf` by `divisor` where they are, with the bits this backend's
  // allreduce gives a sum with one nonzero share (the engine's kept buckets under average
  // world): host backends float(x / divisor), NCCL x * float(1 / divisor) on the compute stream.
  virtual void divide(float* buf, size_t count, double divisor);

  // Small control-sized copies between host memory and this communicator's memory (the engine's
  // count exchange). copy_from_host is ordered before collectives issued after it and `src` may be
  // reused on return; copy_to_host blocks until `dst` holds the data (call it once the work that
  // produced `src` has completed). Host backends: memcpy.
  virtual void copy_from_host(void* dst, const void* src, size_t bytes);
  virtual void copy_to_host(void* dst, const void* src, size_t bytes);

 protected:
  // Backends number their collectives with this as they launch them: 1, 2, 3...
  uint64_t next_sequence() { return ++sequence_; }

 private:
  std::chrono::milliseconds timeout_ = kDefaultTimeout;
  std::atomic<uint64_t> sequence_{0};
};

}  // namespace thetad::comm
