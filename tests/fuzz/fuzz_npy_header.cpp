// libFuzzer target: parse_npy_header on arbitrary bytes. It may only return a header or throw
// ConfigError; anything else (a sanitizer report, another exception, a header that points
// outside the input) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/errors.hpp"
#include "daemon/formats/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Copy into an exact-size heap buffer so that ASan catches a read one byte past the end.
  char* buf = static_cast<char*>(std::malloc(size ? size : 1));
  for (size_t i = 0; i < size; ++i) buf[i] = static_cast<char>(data[i]);
  try {
    const thetad::daemon::NpyHeader h = thetad::daemon::parse_npy_header(buf, size, "fuzz.npy");
    // Invariants of an accepted header.
    if (h.data_offset > size || h.data_offset < 10 || h.shape.size() > thetad::daemon::kNpyMaxDims ||
        thetad::daemon::npy_itemsize(h.dtype) == 0)
      std::abort();
    for (int64_t d : h.shape)
      if (d < 0) std::abort();
    (void)thetad::daemon::npy_numel(h.shape, "fuzz.npy");
    (void)thetad::daemon::npy_dtype_name(h.dtype);
  } catch (const thetad::ConfigError&) {
  }
  std::free(buf);
  return 0;
}
