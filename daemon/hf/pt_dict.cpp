// pt_dict and load_pt_dict (see pt_dict.hpp).
#include "daemon/hf/pt_dict.hpp"

#include <cstdint>
#include <cstring>

#include "common/errors.hpp"
#include "common/file_read.hpp"
#include "daemon/formats/pt_file.hpp"

namespace thetad::daemon {
namespace {

torch::ScalarType scalar_type(PtDtype t) {
  switch (t) {
    case PtDtype::f32: return torch::kFloat32;
    case PtDtype::f64: return torch::kFloat64;
    case PtDtype::f16: return torch::kFloat16;
    case PtDtype::bf16: return torch::kBFloat16;
    case PtDtype::i64: return torch::kInt64;
    case PtDtype::i32: return torch::kInt32;
    case PtDtype::i16: return torch::kInt16;
    case PtDtype::i8: return torch::kInt8;
    case PtDtype::u8: return torch::kUInt8;
    case PtDtype::boolean: return torch::kBool;
  }
  return torch::kFloat32;
}

}  // namespace

c10::impl::GenericDict pt_dict(std::shared_ptr<const void> owner, const char* data, size_t size,
                               const std::string& file, bool check_crc) {
  c10::impl::GenericDict dict(c10::AnyType::get(), c10::AnyType::get());
  for (const PtEntry& e : read_pt_file(data, size, file, check_crc)) {
    const c10::IValue key = e.key_is_string ? c10::IValue(e.key) : c10::IValue(static_cast<int64_t>(std::stoll(e.key)));
    if (!e.is_tensor) {
      dict.insert_or_assign(key, c10::IValue());
      continue;
    }
    const auto options = torch::TensorOptions().dtype(scalar_type(e.tensor.dtype));
    char* at = const_cast<char*>(data) + e.tensor.data_at;
    torch::Tensor t;
    if (reinterpret_cast<uintptr_t>(at) % pt_itemsize(e.tensor.dtype) == 0) {
      t = torch::from_blob(at, e.tensor.shape, [owner](void*) {}, options);
    } else {  // an archive not written by PyTorch may leave a record unaligned: copied
      t = torch::empty(e.tensor.shape, options);
      std::memcpy(t.data_ptr(), at, e.tensor.nbytes);
    }
    dict.insert_or_assign(key, t);
  }
  return dict;
}

c10::impl::GenericDict load_pt_dict(const std::string& path, const std::string& what) {
  auto bytes = std::make_shared<FileBytes>();
  const ReadResult read = read_regular_file(path, SIZE_MAX, *bytes);
  if (!read)
    throw ConfigError(path + ": " + what + ": " + (read.failure == ReadFailure::io ? "cannot read: " : "") + read.why);
  try {
    return pt_dict(bytes, bytes->data(), bytes->size(), path, /*check_crc=*/true);
  } catch (const ConfigError& e) {  // "PATH: ..." -> "PATH: WHAT: ..."
    const std::string msg = e.what(), prefix = path + ": ";
    if (msg.compare(0, prefix.size(), prefix) != 0) throw;
    throw ConfigError(prefix + what + ": " + msg.substr(prefix.size()));
  }
}

}  // namespace thetad::daemon
