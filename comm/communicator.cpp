// Backend-independent parts of the Communicator interface: dtype helpers, the names collectives
// carry in errors and timelines (with their sequence numbers), the timeout message every backend
// uses, and the host-memory defaults of the copy helpers.
#include "comm/communicator.hpp"

#include <cstring>
#include <sstream>

#include "common/errors.hpp"

namespace thetad::comm {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::i32: return 4;
    case DType::bf16: return 2;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::i32: return "int32";
    case DType::bf16: return "bfloat16";
    case DType::i64: return "int64";
    case DType::u8: return "uint8";
  }
  return "unknown";
}

std::string CollectiveTag::describe() const {
  std::ostringstream os;
  os << (what.empty() ? "collective" : what);
  if (bucket >= 0) os << " of bucket " << bucket;
  if (step >= 0) os << " at step " << step;
  return os.str();
}

CollectiveTag named(CollectiveTag tag, const char* op) {
  if (tag.what.empty() || tag.what == "collective") tag.what = op;
  return tag;
}

std::string describe_collective(uint64_t sequence, const CollectiveTag& tag) {
  if (sequence == 0) return tag.describe();
  std::ostringstream os;
  os << "collective #" << sequence << " (" << tag.describe() << ")";
  return os.str();
}

std::string timeout_message(uint64_t sequence, const CollectiveTag& tag, std::chrono::milliseconds timeout) {
  return describe_collective(sequence, tag) + " did not finish within " + format_seconds(timeout);
}

std::string format_seconds(std::chrono::milliseconds ms) {
  std::ostringstream os;
  if (ms.count() % 1000 == 0)
    os << ms.count() / 1000 << " s";
  else
    os << static_cast<double>(ms.count()) / 1000.0 << " s";
  return os.str();
}

namespace {
// Complete from the start: what a host backend's after_compute returns, and a world of one's
// collectives.
class CompletedWork final : public Work {
 public:
  explicit CompletedWork(uint64_t sequence) : sequence_(sequence) {}
  bool is_completed() override { return true; }
  void wait(std::chrono::milliseconds) override {}
  double elapsed_ms() const override { return 0.0; }
  uint64_t sequence() const override { return sequence_; }

 private:
  uint64_t sequence_;
};
}  // namespace

WorkPtr completed_work(uint64_t sequence) { return std::make_shared<CompletedWork>(sequence); }

WorkPtr Communicator::after_compute(const CollectiveTag& tag) {
  (void)tag;
  return completed_work();
}

void Communicator::divide(float* buf, size_t count, double divisor) {
  for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(buf[i] / divisor);
}

PeerOp send_op(const void* buf, size_t count, DType dtype, int peer) {
  return {PeerOp::Kind::send, peer, const_cast<void*>(buf), count, dtype};  // only read
}

PeerOp recv_op(void* buf, size_t count, DType dtype, int peer) { return {PeerOp::Kind::recv, peer, buf, count, dtype}; }

void check_peer_ops(const std::vector<PeerOp>& ops, int rank, int size, const CollectiveTag& tag) {
  for (const PeerOp& op : ops) {
    if (op.peer < 0 || op.peer >= size || op.peer == rank)
      throw InternalError(detail::concat(tag.describe(), ": peer ", op.peer, " is not another rank (rank ", rank,
                                         " of ", size, ")"));
    if (op.count > 0 && op.buf == nullptr)
      throw InternalError(detail::concat(tag.describe(), ": no buffer for ", op.count, " elements"));
  }
}

void Communicator::copy_from_host(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void Communicator::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

}  // namespace thetad::comm
