// Backend-independent parts of the Communicator interface: dtype helpers, the names collectives
// carry in errors and timelines, and the host-memory defaults of the copy helpers.
#include "comm/communicator.hpp"

#include <cstring>
#include <sstream>

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

void Communicator::copy_from_host(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void Communicator::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

}  // namespace thetad::comm
