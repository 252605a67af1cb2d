// libFuzzer target: parse_safetensors_header on arbitrary bytes (as a whole file). It may only
// return a header or throw ConfigError; anything else (a sanitizer report, another exception, a
// tensor whose bytes lie outside the input or overlap another's) is a bug. The same bytes as JSON
// text through parse_json (every JSON file thetad reads from others): a document it keeps is never
// nested deeper than kMaxJsonDepth, and json_brief of every value in it returns.
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <vector>

#include "common/errors.hpp"
#include "common/json_read.hpp"
#include "daemon/formats/safetensors.hpp"

namespace {

// Walks the document without recursion: its depth within the bound, every value quotable.
void check_json(const char* text, size_t size) {
  thetad::JsonProblem problem;
  const nlohmann::json j = thetad::parse_json(text, text + size, problem);
  if (problem != thetad::JsonProblem::none) {
    if (!j.is_discarded()) std::abort();
    return;
  }
  std::vector<std::pair<const nlohmann::json*, size_t>> todo = {{&j, 1}};
  while (!todo.empty()) {
    const auto [v, depth] = todo.back();
    todo.pop_back();
    if (thetad::json_brief(*v).empty()) std::abort();
    if (!v->is_structured()) continue;
    if (depth > thetad::kMaxJsonDepth) std::abort();
    for (const auto& child : *v) todo.emplace_back(&child, depth + 1);
  }
}

}  // namespace

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
  check_json(buf, size);
  std::free(buf);
  return 0;
}
