// libFuzzer target: read_pt_file on arbitrary bytes as a whole file (the zip, its pickle, every
// tensor checked against its record), and parse_pt_pickle on the bytes themselves when they
// start as a pickle does (a pickle inside a valid zip is rarely reached by mutation). Each may
// only return or throw ConfigError; a tensor whose bytes lie outside the input, a sanitizer
// report, another exception, a hang or an allocation far beyond the input is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/errors.hpp"
#include "daemon/formats/pt_file.hpp"
#include "daemon/formats/torch_pickle.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An exact-size heap copy so that ASan catches a read one byte past the end.
  char* buf = static_cast<char*>(std::malloc(size ? size : 1));
  for (size_t i = 0; i < size; ++i) buf[i] = static_cast<char>(data[i]);
  if (size > 0 && data[0] == 0x80) {
    try {
      const thetad::daemon::PtPickle p = thetad::daemon::parse_pt_pickle(buf, size, "fuzz.pkl");
      for (const auto& item : p.items)
        if (item.view >= 0 && (static_cast<size_t>(item.view) >= p.views.size() ||
                               p.views[static_cast<size_t>(item.view)].storage >= p.storages.size()))
          std::abort();
    } catch (const thetad::ConfigError&) {
    }
  }
  for (const bool crc : {true, false}) {
    try {
      unsigned sum = 0;
      for (const auto& e : thetad::daemon::read_pt_file(buf, size, "fuzz.pt", crc)) {
        if (!e.is_tensor) continue;
        if (e.tensor.data_at > size || e.tensor.nbytes > size - e.tensor.data_at) std::abort();
        if (e.tensor.nbytes > 0)  // the first and last byte are readable
          sum += static_cast<unsigned char>(buf[e.tensor.data_at]) +
                 static_cast<unsigned char>(buf[e.tensor.data_at + e.tensor.nbytes - 1]);
      }
      if (sum == 0xFFFFFFFFu) std::abort();  // keeps the reads
    } catch (const thetad::ConfigError&) {
    }
  }
  std::free(buf);
  return 0;
}
