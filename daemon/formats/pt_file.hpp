// A state dict in a PyTorch archive (torch.save of a dict {name: tensor}, thetad's checkpoint
// files) read from its bytes, torch-free and strictly: the archive (torch_zip_read.hpp), its pickle
// (torch_pickle.hpp), and every tensor value held to what thetad can read safely: a contiguous
// view from the start of its storage (offset 0, non-negative strides), within the storage, whose
// bytes are exactly its record's. LibTorch's own reader trusts the pickle for all of these (a
// crafted offset or stride read or wrote outside the record). Fuzzed: tests/fuzz/fuzz_pt_file.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "daemon/formats/torch_pickle.hpp"

namespace thetad::daemon {

struct PtTensor {
  PtDtype dtype = PtDtype::f32;
  std::vector<int64_t> shape;
  uint64_t data_at = 0;  // its first byte in the file
  uint64_t nbytes = 0;   // numel x itemsize, within its record
};

struct PtEntry {
  std::string key;            // as in the file: messages quote it through printable()
  bool key_is_string = true;  // else an integer key, `key` its digits
  bool is_tensor = false;
  std::string kind;  // the value's kind for messages ("a tensor", "an integer", ...)
  PtTensor tensor;   // when is_tensor
};

// data.pkl above this is refused (a state dict's pickle is ~200 bytes a tensor).
constexpr uint64_t kPtMaxPickleBytes = uint64_t{256} << 20;

// The dict's entries in its order. `check_crc`: every record read (the pickle, the tensors'
// storages) against its CRC-32 (a file without a checksum of its own); checkpoint files, whose
// manifest checksums them whole, skip it. Throws ConfigError "FILE: ..." naming the tensor's key
// where one is at fault. Never reads outside [data, data + size).
std::vector<PtEntry> read_pt_file(const char* data, size_t size, const std::string& file, bool check_crc);

}  // namespace thetad::daemon
