// Reading NumPy .npy files: a strict, bounded header parser (fuzzed: tests/fuzz) and a
// move-only memory map of a whole file, with errors that name the file and the problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "daemon/formats/mapped_file.hpp"

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

// A read-only memory map of one .npy file. Move-only; unmaps on destruction. Its header is
// copied out of the map and parsed at open; its elements are read only inside read(), so that a
// file another process shortens while it is mapped is a ConfigError naming it, not SIGBUS.
class NpyArray {
 public:
  // Maps `path` and checks it: header valid, little-endian or byte-order-free data, C order
  // (Fortran order is refused for ndim >= 2), file size == data_offset + numel * itemsize.
  // Throws ConfigError naming the path on any problem (missing file included).
  static NpyArray open(const std::string& path);

  const std::string& path() const { return map_.path(); }
  const NpyHeader& header() const { return header_; }
  const std::string& dtype() const { return header_.dtype; }
  const std::vector<int64_t>& shape() const { return header_.shape; }
  size_t ndim() const { return header_.shape.size(); }
  int64_t numel() const { return numel_; }
  size_t itemsize() const { return itemsize_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * itemsize_; }
  // Start of the element data (not aligned beyond what the file gives: numpy pads headers so
  // that data starts at a multiple of 64, hence 16, bytes into the file). Read it inside read().
  const void* data() const { return map_.data() == nullptr ? nullptr : map_.data() + header_.data_offset; }
  template <typename T>
  const T* data_as() const { return static_cast<const T*>(data()); }

  // Runs `copy`, which reads data() (MappedFile::read: it must own nothing that needs
  // destroying); ConfigError "PATH: WHAT: cannot be read: the file is now N bytes, ..." when the
  // file was shortened since it was opened.
  template <typename F>
  void read(const std::string& what, F&& copy) const {
    map_.read(what, std::forward<F>(copy));
  }

  // Throws ConfigError "FILE: expected float32 ('<f4'), found '<f8'" when the dtype differs.
  void require_dtype(const std::string& dtype) const;
  // Throws ConfigError "FILE: expected a 2-D array, found shape (10)" when ndim differs.
  void require_ndim(size_t ndim) const;

 private:
  MappedFile map_;
  NpyHeader header_;
  int64_t numel_ = 0;
  size_t itemsize_ = 0;
};

// "(3, 4)" for error messages.
std::string npy_shape_string(const std::vector<int64_t>& shape);

}  // namespace thetad::daemon
