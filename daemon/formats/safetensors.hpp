// Hugging Face safetensors, torch-free: a strict, bounded header parser (fuzzed:
// tests/fuzz/fuzz_safetensors_header.cpp), a memory map of one file, a checkpoint of one file or
// of shards listed by model.safetensors.index.json, F32/BF16/F16 to float32, and a writer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "daemon/formats/mapped_file.hpp"

namespace thetad::daemon {

struct StTensor {
  std::string name;
  std::string dtype;           // "F32", "BF16", "F16", ... (the format's words)
  std::vector<int64_t> shape;  // () for a scalar
  size_t begin = 0, end = 0;   // byte offsets into the data section (after the header)
};

struct StHeader {
  std::vector<StTensor> tensors;              // in the order of their offsets
  std::map<std::string, std::string> metadata;  // "__metadata__" (string values only)
  size_t data_offset = 0;                      // 8 + the header's length
};

// The format's own bound (safetensors refuses headers above 100 MB) and one on the ranks.
constexpr size_t kStMaxHeaderLen = 100u << 20;
constexpr size_t kStMaxDims = 64;

// Parses the header from the first `size` bytes of a file (the whole file: offsets are checked
// against the data that follows the header). Strict: an 8-byte little-endian length that fits,
// a JSON object whose entries are "__metadata__" (strings) or tensors {dtype, shape,
// data_offsets} with a known dtype, byte counts that match the shape, offsets within the data and
// not overlapping. Reads only the length and the header, the first min(size, 8 + length) bytes:
// all a caller must hold at `data`. Throws ConfigError "FILE: ..." naming the tensor where there
// is one.
StHeader parse_safetensors_header(const char* data, size_t size, const std::string& file);

// Bytes per element of a dtype word; 0 for a word the format does not have.
size_t st_itemsize(const std::string& dtype);

// Product of the dims; throws ConfigError naming `file` and `tensor` if it overflows int64.
int64_t st_numel(const std::vector<int64_t>& shape, const std::string& file, const std::string& tensor);

// "[3, 4]" for messages.
std::string st_shape_string(const std::vector<int64_t>& shape);

// Converts n elements of F32, BF16 or F16 at `src` (any alignment, little-endian) to float32.
// Throws ConfigError naming `where` for another dtype.
void st_to_fp32(const std::string& dtype, const void* src, size_t n, float* dst, const std::string& where);
// The index of the first of n F32, BF16 or F16 values (raw little-endian bits, any alignment)
// that is NaN or infinite, or -1 (also for another dtype). A pass over the bits alone, cheap next
// to a conversion: model.init_from and lora.init_from refuse such values before any step.
int64_t st_first_nonfinite(const std::string& dtype, const void* src, size_t n);
// "value I is nan" ("inf", "-inf") for element i of such values, for messages.
std::string st_nonfinite_text(const std::string& dtype, const void* src, int64_t i);
// "nan", "inf" or "-inf": the one such value at `value`.
std::string st_nonfinite_word(const std::string& dtype, const void* value);
// float32 to bf16 bits, rounding to nearest even (NaN stays NaN).
uint16_t st_fp32_to_bf16(float f);
// Converts n elements of F32, BF16 or F16 to bf16 bits: BF16 copied, the others rounded to nearest
// even from their float32 value (what LibTorch's cast of that float32 gives, NaN aside).
// Throws ConfigError naming `where` for another dtype.
void st_to_bf16(const std::string& dtype, const void* src, size_t n, uint16_t* dst, const std::string& where);

// One mapped .safetensors file. Move-only; unmaps on destruction.
class SafetensorsFile {
 public:
  // Maps and checks `path` (missing file, size, header: ConfigError naming the path).
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return map_.path(); }
  const StHeader& header() const { return header_; }
  const StTensor* find(const std::string& name) const;
  // Runs `use(bytes)` with the tensor's bytes in the map (its dtype, little-endian, any
  // alignment), guarded: the file shortened since it was opened is ConfigError
  // "PATH: tensor 'NAME': cannot be read: ..." on this thread (MappedFile::read: `use` copies or
  // converts out of the map and owns nothing that needs destroying).
  template <typename F>
  void read(const StTensor& t, F&& use) const {
    const char* bytes = map_.data() + header_.data_offset + t.begin;
    map_.read(tensor_text(t), [&] { use(bytes); });
  }

 private:
  static std::string tensor_text(const StTensor& t);  // "tensor 'NAME'"
  MappedFile map_;
  StHeader header_;
  std::map<std::string, size_t> index_;
};

// A checkpoint: a .safetensors file, or a directory with model.safetensors, or with shards
// listed in model.safetensors.index.json ({"weight_map": {tensor: file}}; every listed tensor
// must be in its file, and no tensor may be in two files).
class SafetensorsCheckpoint {
 public:
  static SafetensorsCheckpoint open(const std::string& path);

  const std::string& path() const { return path_; }
  // Every tensor's name, sorted.
  std::vector<std::string> names() const;
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  // The tensor's shape; ConfigError "PATH: tensor 'NAME' is missing" when absent.
  const StTensor& tensor(const std::string& name) const;
  // The file holding the tensor (for messages).
  const std::string& file_of(const std::string& name) const;
  // The tensor as float32 into dst (numel elements); `expect` its shape (ConfigError naming the
  // file, the tensor and both shapes when different). Guarded as `read` is.
  void read_fp32(const std::string& name, const std::vector<int64_t>& expect, float* dst) const;
  // Runs `use(bytes)` with the tensor's bytes in the map (tensor(name).dtype, little-endian, any
  // alignment), guarded against the file shortened under it (SafetensorsFile::read).
  template <typename F>
  void read(const std::string& name, F&& use) const {
    const auto& [file, t] = where_of(name);
    files_[file]->read(*t, std::forward<F>(use));
  }

 private:
  // (file, tensor) of `name`; ConfigError as `tensor` when absent.
  const std::pair<size_t, const StTensor*>& where_of(const std::string& name) const;
  std::string path_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<size_t, const StTensor*>> where_;  // name -> (file, tensor)
};

// A tensor to write: raw little-endian bytes of `dtype` (bytes.size() == numel * itemsize).
struct StWriteTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

// Writes a .safetensors file: header padded with spaces to a multiple of 8 bytes (as the
// reference writer does), tensors in the given order. Written to PATH.tmp, fsynced, renamed.
// Throws InternalError on an inconsistent tensor, Error on an I/O failure.
void write_safetensors(const std::string& path, const std::vector<StWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// The same bytes at `path` itself (no temporary name, no rename), fsynced when `sync`: for
// writers that make many files durable at once (the adapter export: one syncfs, then renames).
// A failure removes the file.
void write_safetensors_file(const std::string& path, const std::vector<StWriteTensor>& tensors,
                            const std::map<std::string, std::string>& metadata, bool sync);

}  // namespace thetad::daemon
