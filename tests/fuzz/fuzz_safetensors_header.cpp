// libFuzzer target: parse_safetensors_header on arbitrary bytes (as a whole file). It may only
// return a header or throw ConfigError; anything else (a sanitizer report, another exception, a
// tensor whose bytes lie outside the input or overlap another's) is a bug.
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <vector>

#include "common/errors.hpp"
#include "daemon/formats/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An exact-size heap copy so that ASan catches a read one byte past the end.
  char* buf = static_cast<char*>(std::malloc(size ? size : 1));
  for (size_t i = 0; i < size; ++i) buf[i] = static_cast<char>(data[i]);
  try {
    const thetad::daemon::StHeader h = thetad::daemon::parse_safetensors_header(buf, size, "fuzz.safetensors");
    size_t prev_end = 0;
    for (const auto& t : h.tensors) {
      if (h.data_offset + t.end > size || t.begin > t.end || t.begin < prev_end || t.shape.size() > thetad::daemon::kStMaxDims ||
          thetad::daemon::st_itemsize(t.dtype) == 0)
        std::abort();
      prev_end = t.end;
      std::vector<float> out(std::min<size_t>((t.end - t.begin) / thetad::daemon::st_itemsize(t.dtype), 64));
      try {
        thetad::daemon::st_to_fp32(t.dtype, buf + h.data_offset + t.begin, out.size(), out.data(), "fuzz");
      } catch (const thetad::ConfigError&) {
      }
    }
  } catch (const thetad::ConfigError&) {
  }
  std::free(buf);
  return 0;
}
