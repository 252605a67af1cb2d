// MpiCommunicator and its progress thread (see mpi_communicator.hpp).
//
// Nonblocking collectives must be posted in the same order on every rank, so only the progress
// thread posts them, in queue order. It also is the only thread that tests them: MPI progresses
// nonblocking collectives only inside MPI calls, and a thread that polls keeps the reduction of
// one bucket going while backward computes the next.
#include "comm/mpi/mpi_communicator.hpp"

#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "comm/backends.hpp"
#include "comm/bf16.hpp"
#include "comm/mpi_check.hpp"
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
void divide(void* buf, size_t count, DType dtype, double divisor) {
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

// The queue of collectives not yet posted, the ones in flight, and the thread that drives both.
class MpiProgress : public std::enable_shared_from_this<MpiProgress> {
 public:
  struct Op {
    std::shared_ptr<MpiWork> work;
    std::function<int(MPI_Request*)> post;  // returns an MPI error code
    std::function<void()> finish;           // after completion (the divisor), may be empty
  };

  void start() { thread_ = std::thread([this] { run(); }); }

  void submit(Op op) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_) {
        op.work->fail(std::make_exception_ptr(CommError("communicator was aborted: " + why_)));
        return;
      }
      queue_.push_back(std::move(op));
    }
    cv_.notify_one();
  }

  // Fails every queued and in-flight work with `error`; later submissions fail at once.
  // Requests already posted stay with the thread, which keeps testing them until it stops.
  void abort(const std::string& why, std::exception_ptr error) {
    std::vector<std::shared_ptr<MpiWork>> victims;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_) return;
      aborted_ = true;
      why_ = why;
      for (Op& op : queue_) victims.push_back(op.work);
      queue_.clear();
      for (auto& w : inflight_) victims.push_back(w);
    }
    THETAD_LOG(error, "comm") << "aborting MPI communicator: " << why;
    for (auto& w : victims) w->fail(error);
    cv_.notify_one();
  }

  bool aborted() {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }

  // Returns whether every posted request finished (if not, they are leaked: the communicator
  // they belong to must then not be freed).
  bool stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
    return reqs_.empty();
  }

 private:
  // How long a thread that made no progress sleeps before testing again; short, because the
  // caller may be waiting for exactly this bucket, and a submit wakes it at once anyway.
  static constexpr std::chrono::microseconds kIdlePoll{50};
  // After stop, how long requests still in flight (after an abort) are given to drain.
  static constexpr std::chrono::milliseconds kDrain{2000};

  void run() {
    auto drain_deadline = std::chrono::steady_clock::time_point::max();
    for (;;) {
      std::deque<Op> to_post;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (reqs_.empty() && queue_.empty() && !stop_)
          cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) {
          if (reqs_.empty()) return;
          if (drain_deadline == std::chrono::steady_clock::time_point::max())
            drain_deadline = std::chrono::steady_clock::now() + kDrain;
          if (std::chrono::steady_clock::now() > drain_deadline) {
            THETAD_LOG(warn, "comm") << reqs_.size()
                                     << " MPI request(s) still in flight at shutdown; leaking them";
            return;
          }
        }
        to_post.swap(queue_);
      }
      for (Op& op : to_post) post(op);
      if (!test()) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, kIdlePoll, [&] { return !queue_.empty() || stop_; });
      }
    }
  }

  void post(Op& op) {
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_SUCCESS;
    try {
      rc = op.post(&req);
      if (rc != MPI_SUCCESS)
        throw_mpi_error(rc, __FILE__, __LINE__, describe_collective(op.work->sequence(), op.work->tag()).c_str());
    } catch (...) {
      op.work->fail(std::current_exception());
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      inflight_.push_back(op.work);
    }
    reqs_.push_back(req);
    ops_.push_back(std::move(op));
  }

  // Returns whether any request finished.
  bool test() {
    if (reqs_.empty()) return false;
    int n = static_cast<int>(reqs_.size()), outcount = 0;
    indices_.resize(n);
    int rc = MPI_Testsome(n, reqs_.data(), &outcount, indices_.data(), MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      // Which request failed is not reported reliably; none of them can be trusted any more.
      std::exception_ptr err;
      try {
        throw_mpi_error(rc, __FILE__, __LINE__, "MPI_Testsome");
      } catch (...) {
        err = std::current_exception();
      }
      for (Op& op : ops_) op.work->fail(err);
      abort("an MPI request failed", err);
      reqs_.clear();
      ops_.clear();
      std::lock_guard<std::mutex> lock(mu_);
      inflight_.clear();
      return true;
    }
    if (outcount == MPI_UNDEFINED || outcount == 0) return false;
    const bool dropped = aborted();
    for (int k = 0; k < outcount; ++k) {
      Op& op = ops_[indices_[k]];
      if (dropped) continue;  // its work already failed; the data is not trusted
      try {
        if (op.finish) op.finish();
        op.work->complete();
      } catch (...) {
        op.work->fail(std::current_exception());
      }
    }
    // Compact: keep the requests that are still active, in posting order.
    std::vector<bool> done(n, false);
    for (int k = 0; k < outcount; ++k) done[indices_[k]] = true;
    size_t j = 0;
    for (int i = 0; i < n; ++i) {
      if (done[i]) continue;
      reqs_[j] = reqs_[i];
      if (j != static_cast<size_t>(i)) ops_[j] = std::move(ops_[i]);
      ++j;
    }
    reqs_.resize(j);
    ops_.resize(j);
    std::lock_guard<std::mutex> lock(mu_);
    inflight_.clear();
    for (Op& op : ops_) inflight_.push_back(op.work);
    return true;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;                            // guarded by mu_
  std::vector<std::shared_ptr<MpiWork>> inflight_;  // guarded by mu_ (for abort)
  bool aborted_ = false;                            // guarded by mu_
  bool stop_ = false;                               // guarded by mu_
  std::string why_;
  // Only the progress thread touches these.
  std::vector<MPI_Request> reqs_;
  std::vector<Op> ops_;
  std::vector<int> indices_;
  std::thread thread_;
};

namespace {
// A work whose timed-out wait aborts the communicator with the TimeoutError itself, so every
// other waiter sees the same error.
std::shared_ptr<MpiWork> new_work(const std::shared_ptr<MpiProgress>& progress, uint64_t sequence,
                                  CollectiveTag tag) {
  return std::make_shared<MpiWork>(sequence, std::move(tag), [p = std::weak_ptr<MpiProgress>(progress)](const std::string& why) {
    if (auto s = p.lock()) s->abort(why, std::make_exception_ptr(TimeoutError(why)));
  });
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
      divide(buf, count, dtype, opts.divisor);
    }
    return completed_work(sequence);
  }
  auto work = new_work(progress_, next_sequence(), tag);
  MpiProgress::Op o;
  o.work = work;
  MPI_Comm comm = comm_;
  if (opts.bf16_wire) {
    // Packed on the progress thread when it posts (the buffer is final from launch on), so the
    // caller's thread (backward's hooks) does not pay for the conversion; unpacked once summed.
    auto wire = std::make_shared<std::vector<uint16_t>>();
    auto* values = static_cast<float*>(buf);
    const float factor = static_cast<float>(1.0 / opts.divisor);
    MPI_Op bf16_sum = bf16_sum_;
    o.post = [=](MPI_Request* req) {
      wire->resize(count);
      to_bf16_scaled(values, wire->data(), count, factor);
      if (root >= 0) return MPI_Ibcast(wire->data(), n, MPI_UINT16_T, root, comm, req);
      return MPI_Iallreduce(MPI_IN_PLACE, wire->data(), n, MPI_UINT16_T, bf16_sum, comm, req);
    };
    o.finish = [=] { from_bf16(wire->data(), values, count); };
    progress_->submit(std::move(o));
    return work;
  }
  if (root >= 0)  // the others' buffers are zero: the sum is root's buffer
    o.post = [=](MPI_Request* req) { return MPI_Ibcast(buf, n, type, root, comm, req); };
  else
    o.post = [=](MPI_Request* req) { return MPI_Iallreduce(MPI_IN_PLACE, buf, n, type, op, comm, req); };
  if (opts.divisor != 1.0) {
    const double d = opts.divisor;
    o.finish = [=] { divide(buf, count, dtype, d); };
  }
  progress_->submit(std::move(o));
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
  auto work = new_work(progress_, next_sequence(), tag);
  const MPI_Datatype type = mpi_type(dtype);
  MPI_Comm comm = comm_;
  progress_->submit({work, [=](MPI_Request* req) { return MPI_Ibcast(buf, n, type, root, comm, req); }, {}});
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
  auto work = new_work(progress_, next_sequence(), tag);
  const MPI_Datatype type = mpi_type(dtype);
  MPI_Comm comm = comm_;
  progress_->submit({work, [=](MPI_Request* req) {
                       return MPI_Iallgather(send, n, type, recv, n, type, comm, req);
                     }, {}});
  return work;
}

WorkPtr MpiCommunicator::barrier(const CollectiveTag& t) {
  CollectiveTag tag = named(t, "barrier");
  if (done_here()) {  // nobody to wait for
    const uint64_t sequence = next_sequence();
    return completed_work(sequence);
  }
  auto work = new_work(progress_, next_sequence(), tag);
  MPI_Comm comm = comm_;
  progress_->submit({work, [=](MPI_Request* req) { return MPI_Ibarrier(comm, req); }, {}});
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
