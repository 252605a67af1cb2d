// Reading NumPy .npy files: a strict, bounded header parser (fuzzed: tests/fuzz) and a
// move-only memory map of a whole file, with errors that name the file and the problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace thetad::daemon {

struct NpyHeader {
  std::string dtype;            // the typestr: "<f4", "<i8", "|u1", ...
  bool fortran_order = false;
  std::vector<int64_t> shape;   // () for a scalar
  size_t data_offset = 0;       // bytes from the start of the file to the data
};

// Limits that keep a hostile header from making us allocate or loop without bound.
constexpr size_t kNpyMaxHeaderLen = 1 << 20;  // numpy itself refuses headers above ~10 kB
constexpr size_t kNpyMaxDims = 64;            // NumPy's NPY_MAXDIMS

// Parses the header of a .npy file (format versions 1.0, 2.0 and 3.0) from its first `size`
// bytes. Strict: the magic, the version, the header length, a Python dict literal with exactly
// the keys 'descr' (a simple typestr), 'fortran_order' (True/False) and 'shape' (a tuple of
// non-negative ints). Never reads outside [data, data+size). Throws ConfigError
// "FILE: <what is wrong>" on any malformation. Does not check that the data fits in `size`.
NpyHeader parse_npy_header(const char* data, size_t size, const std::string& file);

// Bytes per element of a typestr accepted by parse_npy_header ("<f4" -> 4).
size_t npy_itemsize(const std::string& dtype);

// A human name for a typestr: "<f4" -> "float32", "<i8" -> "int64"; the typestr itself for
// anything else.
std::string npy_dtype_name(const std::string& dtype);

// Product of the dims; throws ConfigError naming `file` if it overflows int64.
int64_t npy_numel(const std::vector<int64_t>& shape, const std::string& file);

// A read-only memory map of one .npy file. Move-only; unmaps on destruction.
class NpyArray {
 public:
  // Maps `path` and checks it: header valid, little-endian or byte-order-free data, C order
  // (Fortran order is refused for ndim >= 2), file size == data_offset + numel * itemsize.
  // Throws ConfigError naming the path on any problem (missing file included).
  static NpyArray open(const std::string& path);

  NpyArray() = default;
  NpyArray(NpyArray&& other) noexcept;
  NpyArray& operator=(NpyArray&& other) noexcept;
  NpyArray(const NpyArray&) = delete;
  NpyArray& operator=(const NpyArray&) = delete;
  ~NpyArray();

  const std::string& path() const { return path_; }
  const NpyHeader& header() const { return header_; }
  const std::string& dtype() const { return header_.dtype; }
  const std::vector<int64_t>& shape() const { return header_.shape; }
  size_t ndim() const { return header_.shape.size(); }
  int64_t numel() const { return numel_; }
  size_t itemsize() const { return itemsize_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * itemsize_; }
  // Start of the element data (not aligned beyond what the file gives: numpy pads headers so
  // that data starts at a multiple of 64, hence 16, bytes into the file).
  const void* data() const { return data_; }
  template <typename T>
  const T* data_as() const { return static_cast<const T*>(data_); }

  // Throws ConfigError "FILE: expected float32 ('<f4'), found '<f8'" when the dtype differs.
  void require_dtype(const std::string& dtype) const;
  // Throws ConfigError "FILE: expected a 2-D array, found shape (10)" when ndim differs.
  void require_ndim(size_t ndim) const;

 private:
  void reset() noexcept;

  std::string path_;
  NpyHeader header_;
  int64_t numel_ = 0;
  size_t itemsize_ = 0;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const void* data_ = nullptr;
};

// "(3, 4)" for error messages.
std::string npy_shape_string(const std::vector<int64_t>& shape);

}  // namespace thetad::daemon
