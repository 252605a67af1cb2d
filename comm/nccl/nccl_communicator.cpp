// NcclCommunicator (see nccl_communicator.hpp).
#include "comm/nccl/nccl_communicator.hpp"

#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "comm/backends.hpp"
#include "comm/bf16.hpp"
#include "comm/bootstrap.hpp"
#include "comm/control_plane.hpp"
#include "comm/mpi_check.hpp"
#include "comm/nccl/scale.hpp"
#include "comm/node_split.hpp"
#include "common/log.hpp"

namespace thetad::comm {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::i32: return ncclInt32;
    case DType::bf16: return ncclBfloat16;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
  }
  return ncclFloat32;
}

// How often the watchdog looks at outstanding collectives.
constexpr std::chrono::milliseconds kWatchdogPeriod{100};

}  // namespace

NcclCommunicator::NcclCommunicator(int rank, int size, const void* id, int device)
    : rank_(rank), size_(size), core_(std::make_shared<NcclCore>()) {
  core_->device = device;
  CUDA_CHECK(cudaSetDevice(device));
  int least = 0, greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  // Numerically lowest is the highest priority: gradient reductions should not queue behind
  // backward's kernels.
  core_->comm_stream = CudaStream(device, greatest);
  core_->copy_stream = CudaStream(device, greatest);
  ncclUniqueId uid;
  std::memcpy(&uid, id, sizeof uid);
  core_->comm = NcclComm(size, uid, rank);
  barrier_buf_ = allocate(sizeof(float));
  wd_thread_ = std::thread([this] { watchdog(); });
  // NCCL connects peers lazily, inside the first collective's enqueue, where the watchdog cannot
  // reach a stalled peer; a collective here, while every rank is known to be present, does it.
  barrier({"warm-up barrier", -1, -1})->wait(default_timeout());
  THETAD_LOG(info, "comm") << "NCCL communicator: rank " << rank << " of " << size << " on GPU " << device;
}

NcclCommunicator::~NcclCommunicator() {
  {
    std::lock_guard<std::mutex> lock(wd_mu_);
    wd_stop_ = true;
  }
  wd_cv_.notify_all();
  if (wd_thread_.joinable()) wd_thread_.join();
  std::lock_guard<std::mutex> lock(core_->mu);
  if (!core_->aborted) cudaStreamSynchronize(core_->comm_stream.get());
  barrier_buf_.reset();
  core_->outstanding.clear();
  // The NcclComm itself goes with the last owner of the core (works may outlive us).
}

template <typename F>
WorkPtr NcclCommunicator::launch(CollectiveTag tag, bool after_compute, F&& enqueue) {
  std::lock_guard<std::mutex> lock(core_->mu);
  if (core_->aborted) throw CommError("NCCL communicator was aborted: " + core_->abort_reason);
  CUDA_CHECK(cudaSetDevice(core_->device));
  cudaStream_t stream = core_->comm_stream.get();
  if (after_compute) {
    CudaEvent ready(core_->device);
    CUDA_CHECK(cudaEventRecord(ready.get(), core_->compute_stream));
    CUDA_CHECK(cudaStreamWaitEvent(stream, ready.get(), 0));
  }  // destroying a recorded event is fine: the wait already captured it
  auto work = std::make_shared<NcclWork>(core_, next_sequence(), std::move(tag));
  CUDA_CHECK(cudaEventRecord(work->start_event(), stream));
  enqueue(core_->comm.get(), stream);
  CUDA_CHECK(cudaEventRecord(work->event(), stream));
  core_->outstanding.push_back(work);
  return work;
}

WorkPtr NcclCommunicator::allreduce(void* buf, size_t count, DType dtype, const AllreduceOptions& opts) {
  CollectiveTag tag = named(opts.tag, "allreduce");
  if (!(opts.divisor > 0)) throw InternalError(tag.describe() + ": divisor must be positive");
  const bool scaled = opts.divisor != 1.0;
  if (scaled && (dtype == DType::i32 || opts.op == ReduceOp::max))
    throw InternalError(detail::concat(tag.describe(), ": the NCCL backend divides only float sums (",
                                     dtype_name(dtype), ", divisor ", opts.divisor, ")"));
  const ncclDataType_t type = nccl_type(dtype);
  const int root = opts.from_root;
  if (root >= 0 && (root >= size_ || opts.op != ReduceOp::sum || (scaled && dtype != DType::f32)))
    throw InternalError(detail::concat(tag.describe(), ": from_root ", root, " needs a rank, a sum and, divided, float32"));
  const bool bf16_wire = opts.bf16_wire;
  if (bf16_wire && (dtype != DType::f32 || opts.op != ReduceOp::sum))
    throw InternalError(detail::concat(tag.describe(), ": only float32 sums travel as bfloat16, not a ",
                                       dtype_name(dtype), opts.op == ReduceOp::sum ? " sum" : " max"));
  return launch(std::move(tag), opts.after_compute, [&](ncclComm_t comm, cudaStream_t stream) {
    if (bf16_wire) {
      // Round each rank's share into the wire, reduce (or send the root's) in bf16, widen back.
      uint16_t* wire = wire_buffer(count);
      if (root < 0 || rank_ == root)
        to_bf16_scaled_async(static_cast<const float*>(buf), wire, count, static_cast<float>(1.0 / opts.divisor), stream);
      if (root >= 0) NCCL_CHECK(ncclBroadcast(wire, wire, count, ncclBfloat16, root, comm, stream));
      else NCCL_CHECK(ncclAllReduce(wire, wire, count, ncclBfloat16, ncclSum, comm, stream));
      from_bf16_async(wire, static_cast<float*>(buf), count, stream);
      return;
    }
    if (root >= 0) {
      // The root scales its buffer by the same float factor PreMulSum would apply, then sends.
      if (scaled && rank_ == root)
        scale_f32_async(static_cast<float*>(buf), count, static_cast<float>(1.0 / opts.divisor), stream);
      NCCL_CHECK(ncclBroadcast(buf, buf, count, type, root, comm, stream));
      return;
    }
    if (!scaled) {
      NCCL_CHECK(ncclAllReduce(buf, buf, count, type, opts.op == ReduceOp::sum ? ncclSum : ncclMax,
                               comm, stream));
      return;
    }
    // PreMulSum: each rank's input is scaled by 1/divisor inside the reduction kernel, so the
    // division costs no extra pass over the bucket.
    ncclRedOp_t op;
    float f = static_cast<float>(1.0 / opts.divisor);
    uint16_t h = float_to_bf16(f);
    void* scalar = dtype == DType::bf16 ? static_cast<void*>(&h) : static_cast<void*>(&f);
    NCCL_CHECK(ncclRedOpCreatePreMulSum(&op, scalar, type, ncclScalarHostImmediate, comm));
    const ncclResult_t rc = ncclAllReduce(buf, buf, count, type, op, comm, stream);
    ncclRedOpDestroy(op, comm);  // allowed once the last call using it is enqueued
    NCCL_CHECK(rc);
  });
}

uint16_t* NcclCommunicator::wire_buffer(size_t count) {
  if (count > wire_count_) {
    // The old buffer may still be read by work queued on the comm stream: let that finish first
    // (only while the buffer grows to the largest bucket, in the first steps).
    if (wire_buf_) CUDA_CHECK(cudaStreamSynchronize(core_->comm_stream.get()));
    wire_buf_ = allocate(count * sizeof(uint16_t));
    wire_count_ = count;
  }
  return static_cast<uint16_t*>(wire_buf_.get());
}

WorkPtr NcclCommunicator::broadcast(void* buf, size_t count, DType dtype, int root, const CollectiveTag& t) {
  return launch(named(t, "broadcast"), true, [&](ncclComm_t comm, cudaStream_t stream) {
    NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_type(dtype), root, comm, stream));
  });
}

WorkPtr NcclCommunicator::allgather(const void* send, void* recv, size_t count, DType dtype,
                                    const CollectiveTag& t) {
  return launch(named(t, "allgather"), true, [&](ncclComm_t comm, cudaStream_t stream) {
    NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(dtype), comm, stream));
  });
}

WorkPtr NcclCommunicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                         const CollectiveTag& t) {
  return launch(named(t, "reduce-scatter"), true, [&](ncclComm_t comm, cudaStream_t stream) {
    NCCL_CHECK(ncclReduceScatter(send, recv, count, nccl_type(dtype), op == ReduceOp::sum ? ncclSum : ncclMax, comm,
                                 stream));
  });
}

// One group call: NCCL starts a rank's sends and receives together, so that two ranks may send to
// each other at once. The group is always closed, also when an enqueue failed.
WorkPtr NcclCommunicator::exchange(const std::vector<PeerOp>& ops, const CollectiveTag& t) {
  CollectiveTag tag = named(t, "send/recv");
  check_peer_ops(ops, rank_, size_, tag);
  return launch(std::move(tag), true, [&](ncclComm_t comm, cudaStream_t stream) {
    NCCL_CHECK(ncclGroupStart());
    ncclResult_t rc = ncclSuccess;
    for (const PeerOp& op : ops) {
      if (rc != ncclSuccess) break;
      rc = op.kind == PeerOp::Kind::send ? ncclSend(op.buf, op.count, nccl_type(op.dtype), op.peer, comm, stream)
                                         : ncclRecv(op.buf, op.count, nccl_type(op.dtype), op.peer, comm, stream);
    }
    const ncclResult_t end = ncclGroupEnd();
    NCCL_CHECK(rc);
    NCCL_CHECK(end);
  });
}

WorkPtr NcclCommunicator::barrier(const CollectiveTag& t) {
  // NCCL has no barrier; a one-element allreduce is one.
  void* buf = barrier_buf_.get();
  return launch(named(t, "barrier"), true, [&](ncclComm_t comm, cudaStream_t stream) {
    NCCL_CHECK(ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm, stream));
  });
}

// An empty launch: the communication stream waits for the compute stream, then records the
// work's event.
WorkPtr NcclCommunicator::after_compute(const CollectiveTag& t) {
  return launch(named(t, "after compute"), true, [](ncclComm_t, cudaStream_t) {});
}

void NcclCommunicator::abort(const std::string& why) {
  core_->abort(why, std::make_exception_ptr(CommError("NCCL communicator was aborted: " + why)));
}

void NcclCommunicator::set_compute_stream(void* stream) {
  std::lock_guard<std::mutex> lock(core_->mu);
  core_->compute_stream = static_cast<cudaStream_t>(stream);
}

std::shared_ptr<void> NcclCommunicator::allocate(size_t bytes) {
  CUDA_CHECK(cudaSetDevice(core_->device));
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
  // Zero before any stream may touch it: cudaMemset runs on the legacy default stream, which the
  // non-blocking comm and copy streams do not wait for; unfinished, it could zero the count
  // exchange's result after it landed on one rank only (that rank then launches other buckets).
  CUDA_CHECK(cudaMemset(p, 0, bytes ? bytes : 1));
  CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  const int device = core_->device;
  return std::shared_ptr<void>(p, [device](void* q) {
    cudaSetDevice(device);
    cudaFree(q);
  });
}

void NcclCommunicator::zero(void* ptr, size_t bytes) {
  CUDA_CHECK(cudaSetDevice(core_->device));
  if (bytes) CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, core_->compute_stream));
}

// The kept bucket's PreMulSum factor, applied on the compute stream where the gradient is.
void NcclCommunicator::divide(float* buf, size_t count, double divisor) {
  CUDA_CHECK(cudaSetDevice(core_->device));
  if (count) scale_f32_async(buf, count, static_cast<float>(1.0 / divisor), core_->compute_stream);
}

void NcclCommunicator::copy_from_host(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  std::lock_guard<std::mutex> stage_lock(stage_mu_);
  CUDA_CHECK(cudaSetDevice(core_->device));
  if (stage_pending_) {  // the previous copy has left the staging memory (long done in practice)
    const auto deadline = NcclWork::Clock::now() + default_timeout();
    cudaError_t rc;
    while ((rc = cudaEventQuery(stage_done_.get())) == cudaErrorNotReady) {
      if (NcclWork::Clock::now() > deadline)
        throw TimeoutError("NCCL communicator: a control copy to the device did not finish within " +
                           format_seconds(default_timeout()));
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    CUDA_CHECK(rc);
    stage_pending_ = false;
  }
  if (bytes > stage_bytes_) {
    void* p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, bytes));
    stage_buf_ = std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
    stage_bytes_ = bytes;
  }
  if (!stage_done_) stage_done_ = CudaEvent(core_->device);
  std::memcpy(stage_buf_.get(), src, bytes);  // `src` may be reused once this returns
  std::lock_guard<std::mutex> lock(core_->mu);
  // On the comm stream, so that it precedes the collective issued next.
  CUDA_CHECK(cudaMemcpyAsync(dst, stage_buf_.get(), bytes, cudaMemcpyHostToDevice, core_->comm_stream.get()));
  CUDA_CHECK(cudaEventRecord(stage_done_.get(), core_->comm_stream.get()));
  stage_pending_ = true;
}

void NcclCommunicator::copy_to_host(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaSetDevice(core_->device));
  // A stream of its own: it must not wait for the buckets queued on the comm stream since.
  cudaStream_t s = core_->copy_stream.get();
  if (!bytes) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
}

void NcclCommunicator::watchdog() {
  cudaSetDevice(core_->device);
  std::unique_lock<std::mutex> wl(wd_mu_);
  while (!wd_cv_.wait_for(wl, kWatchdogPeriod, [&] { return wd_stop_; })) {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (core_->aborted) continue;
    auto& out = core_->outstanding;
    for (size_t i = 0; i < out.size();) {
      if (out[i]->poll()) {
        out[i] = out.back();
        out.pop_back();
      } else {
        ++i;
      }
    }
    ncclResult_t async = ncclSuccess;
    if (core_->comm) ncclCommGetAsyncError(core_->comm.get(), &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      const std::string msg = detail::concat("NCCL reported an asynchronous error: ",
                                             ncclGetErrorString(async), " (", ncclGetLastError(core_->comm.get()), ")");
      core_->abort_locked(msg, std::make_exception_ptr(CommError(msg)));
      continue;
    }
    const auto timeout = default_timeout();
    const auto now = NcclWork::Clock::now();
    for (auto& w : out) {
      if (now - w->launched() > timeout) {
        const std::string msg = timeout_message(w->sequence(), w->tag(), timeout);
        core_->abort_locked(msg, std::make_exception_ptr(TimeoutError(msg)));
        break;
      }
    }
  }
}

}  // namespace thetad::comm

namespace thetad::comm {

std::shared_ptr<Communicator> make_nccl_communicator(int device, ControlPlane& plane) {
  WorldInfo w = world_info();
  // Simulated nodes are hosts to NCCL too (node_split.hpp). NCCL reads the id once per process,
  // at its first initialization: set before ncclGetUniqueId, and only once (a second
  // communicator must not append the suffix again).
  static const std::string host_id = simulated_nccl_host_id();
  if (!host_id.empty()) {
    setenv("NCCL_HOSTID", host_id.c_str(), /*overwrite=*/1);
    THETAD_LOG(info, "comm") << "NCCL host id '" << host_id << "': NCCL sees each simulated node as a host";
  }
  ncclUniqueId id{};
  const std::string bytes = exchange_bootstrap_id(plane, [&] {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      throw CommError(detail::concat("NCCL error: ncclGetUniqueId: ", ncclGetErrorString(r)));
    return std::string(reinterpret_cast<const char*>(&id), sizeof id);
  });
  THETAD_CHECK(bytes.size() == sizeof id, CommError, "NCCL bootstrap: the unique id exchange brought ", bytes.size(),
               " bytes, not ", sizeof id);
  std::memcpy(&id, bytes.data(), sizeof id);
  return std::make_shared<NcclCommunicator>(w.rank, w.size, &id, device);
}

}  // namespace thetad::comm
