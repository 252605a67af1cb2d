// MpiCommunicator (see mpi_communicator.hpp): each operation as an MpiProgress::Op, posted and
// polled by the progress thread (comm/mpi/progress.cpp).
#include "comm/mpi/mpi_communicator.hpp"

#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "comm/backends.hpp"
#include "comm/bf16.hpp"
#include "comm/mpi_check.hpp"
#include "comm/mpi/progress.hpp"
#include "comm/mpi/work.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"

namespace thetad::comm {
namespace {

void bf16_sum_fn(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

void bf16_max_fn(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    if (bf16_to_float(a[i]) > bf16_to_float(b[i])) b[i] = a[i];
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::i32: return MPI_INT32_T;
    case DType::bf16: return MPI_UINT16_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

int checked_count(size_t count, const CollectiveTag& tag) {
  if (count > static_cast<size_t>(INT_MAX))
    throw ConfigError(detail::concat(tag.describe(), ": ", count,
                                     " elements exceed the MPI backend's limit of INT_MAX"));
  return static_cast<int>(count);
}

// Integers divide with C++ integer division (truncation).
template <typename T>
void divide_int(void* buf, size_t count, double divisor) {
  auto* p = static_cast<T*>(buf);
  const auto d = static_cast<T>(divisor);
  for (size_t i = 0; i < count; ++i) p[i] = static_cast<T>(p[i] / d);
}

// Divides a reduced buffer in place; runs on the progress thread once the sum has arrived.
void divide_values(void* buf, size_t count, DType dtype, double divisor) {
  switch (dtype) {
    case DType::f32: {
      auto* p = static_cast<float*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = static_cast<float>(p[i] / divisor);
      break;
    }
    case DType::i32: divide_int<int32_t>(buf, count, divisor); break;
    case DType::bf16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < count; ++i)
        p[i] = float_to_bf16(static_cast<float>(bf16_to_float(p[i]) / divisor));
      break;
    }
    case DType::i64: divide_int<int64_t>(buf, count, divisor); break;
    case DType::u8: divide_int<uint8_t>(buf, count, divisor); break;
  }
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm parent) {
  MPI_CHECK(MPI_Comm_dup(parent, &comm_));
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  MPI_CHECK(MPI_Op_create(&bf16_sum_fn, 1, &bf16_sum_));
  MPI_CHECK(MPI_Op_create(&bf16_max_fn, 1, &bf16_max_));
  progress_ = std::make_shared<MpiProgress>();
  progress_->start();
  THETAD_LOG(debug, "comm") << "MPI communicator of " << size_ << " ranks ready";
}

MpiCommunicator::~MpiCommunicator() {
  const bool clean = progress_->stop();
  int finalized = 0;
  MPI_CHECK_NOTHROW(MPI_Finalized(&finalized));
  if (finalized) return;
  MPI_CHECK_NOTHROW(MPI_Op_free(&bf16_sum_));
  MPI_CHECK_NOTHROW(MPI_Op_free(&bf16_max_));
  // A communicator with requests still in flight (after an abort) cannot be freed safely.
  if (clean) MPI_CHECK_NOTHROW(MPI_Comm_free(&comm_));
}

WorkPtr MpiCommunicator::allreduce(void* buf, size_t count, DType dtype, const AllreduceOptions& opts) {
  CollectiveTag tag = named(opts.tag, "allreduce");
  const int n = checked_count(count, tag);
  if (!(opts.divisor > 0)) throw InternalError(tag.describe() + ": divisor must be positive");
  MPI_Op op = opts.op == ReduceOp::sum ? MPI_SUM : MPI_MAX;
  if (dtype == DType::bf16) op = opts.op == ReduceOp::sum ? bf16_sum_ : bf16_max_;
  const MPI_Datatype type = mpi_type(dtype);
  const int root = opts.from_root;
  if (root >= 0 && (root >= size_ || opts.op != ReduceOp::sum))
    throw InternalError(detail::concat(tag.describe(), ": from_root ", root, " needs a rank and a sum"));
  if (opts.bf16_wire && (dtype != DType::f32 || opts.op != ReduceOp::sum))
    throw InternalError(detail::concat(tag.describe(), ": only float32 sums travel as bfloat16, not a ",
                                       dtype_name(dtype), opts.op == ReduceOp::sum ? " sum" : " max"));
  if (done_here()) {  // a world of one: its own sum, max or broadcast, done here
    const uint64_t sequence = next_sequence();
    if (opts.bf16_wire) {
      round_through_bf16_scaled(static_cast<float*>(buf), count, static_cast<float>(1.0 / opts.divisor));
    } else if (opts.divisor != 1.0) {
      divide_values(buf, count, dtype, opts.divisor);
    }
    return completed_work(sequence);
  }
  auto work = new_mpi_work(progress_, next_sequence(), tag);
  MPI_Comm comm = comm_;
  std::function<int(MPI_Request*)> post;
  std::function<void()> finish;
  if (opts.bf16_wire) {
    // Packed on the progress thread when it posts (the buffer is final from launch on), so the
    // caller's thread (backward's hooks) does not pay for the conversion; unpacked once summed.
    auto wire = std::make_shared<std::vector<uint16_t>>();
    auto* values = static_cast<float*>(buf);
    const float factor = static_cast<float>(1.0 / opts.divisor);
    MPI_Op bf16_sum = bf16_sum_;
    post = [=](MPI_Request* req) {
      wire->resize(count);
      to_bf16_scaled(values, wire->data(), count, factor);
      if (root >= 0) return MPI_Ibcast(wire->data(), n, MPI_UINT16_T, root, comm, req);
      return MPI_Iallreduce(MPI_IN_PLACE, wire->data(), n, MPI_UINT16_T, bf16_sum, comm, req);
    };
    finish = [=] { from_bf16(wire->data(), values, count); };
    progress_->submit(MpiProgress::single(work, std::move(post), std::move(finish)));
    return work;
  }
  if (root >= 0)  // the others' buffers are zero: the sum is root's buffer
    post = [=](MPI_Request* req) { return MPI_Ibcast(buf, n, type, root, comm, req); };
  else
    post = [=](MPI_Request* req) { return MPI_Iallreduce(MPI_IN_PLACE, buf, n, type, op, comm, req); };
  if (opts.divisor != 1.0) {
    const double d = opts.divisor;
    finish = [=] { divide_values(buf, count, dtype, d); };
  }
  progress_->submit(MpiProgress::single(work, std::move(post), std::move(finish)));
  return work;
}

WorkPtr MpiCommunicator::broadcast(void* buf, size_t count, DType dtype, int root, const CollectiveTag& t) {
  CollectiveTag tag = named(t, "broadcast");
  const int n = checked_count(count, tag);
  if (root < 0 || root >= size_)
    throw InternalError(detail::concat(tag.describe(), ": root ", root, " is not a rank"));
  if (done_here()) {  // the root's values are already here
    const uint64_t sequence = next_sequence();
    (void)n;
    return completed_work(sequence);
  }
  auto work = new_mpi_work(progress_, next_sequence(), tag);
  const MPI_Datatype type = mpi_type(dtype);
  MPI_Comm comm = comm_;
  progress_->submit(MpiProgress::single(work, [=](MPI_Request* req) { return MPI_Ibcast(buf, n, type, root, comm, req); }));
  return work;
}

WorkPtr MpiCommunicator::allgather(const void* send, void* recv, size_t count, DType dtype,
                                   const CollectiveTag& t) {
  CollectiveTag tag = named(t, "allgather");
  const int n = checked_count(count, tag);
  if (done_here()) {  // the one contribution is the whole result
    const uint64_t sequence = next_sequence();
    if (count > 0 && send != recv) std::memcpy(recv, send, count * dtype_size(dtype));
    return completed_work(sequence);
  }
  auto work = new_mpi_work(progress_, next_sequence(), tag);
  const MPI_Datatype type = mpi_type(dtype);
  MPI_Comm comm = comm_;
  progress_->submit(MpiProgress::single(work, [=](MPI_Request* req) {
    return MPI_Iallgather(send, n, type, recv, n, type, comm, req);
  }));
  return work;
}

WorkPtr MpiCommunicator::barrier(const CollectiveTag& t) {
  CollectiveTag tag = named(t, "barrier");
  if (done_here()) {  // nobody to wait for
    const uint64_t sequence = next_sequence();
    return completed_work(sequence);
  }
  auto work = new_mpi_work(progress_, next_sequence(), tag);
  MPI_Comm comm = comm_;
  progress_->submit(MpiProgress::single(work, [=](MPI_Request* req) { return MPI_Ibarrier(comm, req); }));
  return work;
}

WorkPtr MpiCommunicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp rop,
                                        const CollectiveTag& t) {
  CollectiveTag tag = named(t, "reduce-scatter");
  const int n = checked_count(count, tag);
  if (done_here()) {  // one rank's block is its whole input
    const uint64_t sequence = next_sequence();
    if (count > 0 && send != recv) std::memmove(recv, send, count * dtype_size(dtype));
    return completed_work(sequence);
  }
  MPI_Op op = rop == ReduceOp::sum ? MPI_SUM : MPI_MAX;
  if (dtype == DType::bf16) op = rop == ReduceOp::sum ? bf16_sum_ : bf16_max_;
  auto work = new_mpi_work(progress_, next_sequence(), tag);
  const MPI_Datatype type = mpi_type(dtype);
  MPI_Comm comm = comm_;
  progress_->submit(MpiProgress::single(work, [=](MPI_Request* req) {
    return MPI_Ireduce_scatter_block(send, recv, n, type, op, comm, req);
  }));
  return work;
}

// Sends and receives on the communicator's own tag: between two ranks they match in the order
// both post them (MPI does not let messages of one tag overtake each other), and the progress
// thread posts in submission order.
WorkPtr MpiCommunicator::exchange(const std::vector<PeerOp>& ops, const CollectiveTag& t) {
  CollectiveTag tag = named(t, "send/recv");
  check_peer_ops(ops, rank_, size_, tag);
  for (const PeerOp& op : ops) (void)checked_count(op.count, tag);
  if (ops.empty()) return completed_work(next_sequence());
  auto work = new_mpi_work(progress_, next_sequence(), tag);
  MPI_Comm comm = comm_;
  MpiProgress::Op o;
  o.work = work;
  o.post = [=](std::vector<MPI_Request>& reqs) {
    for (const PeerOp& op : ops) {
      MPI_Request req = MPI_REQUEST_NULL;
      const int n = static_cast<int>(op.count);
      const int rc = op.kind == PeerOp::Kind::send
                         ? MPI_Isend(op.buf, n, mpi_type(op.dtype), op.peer, kPeerTag, comm, &req)
                         : MPI_Irecv(op.buf, n, mpi_type(op.dtype), op.peer, kPeerTag, comm, &req);
      if (rc != MPI_SUCCESS) return rc;
      reqs.push_back(req);
    }
    return MPI_SUCCESS;
  };
  progress_->submit(std::move(o));
  return work;
}

bool MpiCommunicator::done_here() const {
  // An aborted communicator fails every later collective, a world of one too: those go the
  // progress thread's way, which fails them with the abort's reason.
  return size_ == 1 && !progress_->aborted();
}

void MpiCommunicator::abort(const std::string& why) {
  progress_->abort(why, std::make_exception_ptr(CommError("communicator was aborted: " + why)));
}

std::shared_ptr<void> MpiCommunicator::allocate(size_t bytes) {
  // 64-byte alignment: a cache line, and what vectorized reductions like.
  const size_t rounded = ((bytes + 63) / 64) * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) throw InternalError(detail::concat("out of host memory allocating ", bytes, " bytes"));
  std::memset(p, 0, rounded ? rounded : 64);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

void MpiCommunicator::zero(void* ptr, size_t bytes) {
  if (bytes) std::memset(ptr, 0, bytes);
}

}  // namespace thetad::comm

namespace thetad::comm {

std::shared_ptr<Communicator> make_mpi_communicator() {
  return std::make_shared<MpiCommunicator>(MPI_COMM_WORLD);
}

}  // namespace thetad::comm
