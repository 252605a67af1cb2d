// Line cutting and rank tagging of the merged log (see log_merge.hpp).
#include "launch/log_merge.hpp"

#include <cctype>
#include <cstring>

namespace thetad::launch {

std::string LineBuffer::feed(const char* data, size_t n) {
  const char* end = data + n;
  const char* last_nl = nullptr;
  for (const char* p = end; p != data;)
    if (*--p == '\n') {
      last_nl = p;
      break;
    }
  if (!last_nl) {
    partial_.append(data, n);
    return {};
  }
  std::string out;
  out.swap(partial_);
  out.append(data, size_t(last_nl + 1 - data));
  partial_.assign(last_nl + 1, end);
  return out;
}

std::string LineBuffer::finish() {
  if (partial_.empty()) return {};
  std::string out;
  out.swap(partial_);
  out += '\n';
  return out;
}

namespace {

// Whether [begin, end) contains "[rank <digits>]".
bool has_rank_tag(const char* begin, const char* end) {
  static const char kTag[] = "[rank ";
  const size_t k = sizeof kTag - 1;
  for (const char* p = begin; p + k < end; ++p) {
    if (std::memcmp(p, kTag, k) != 0) continue;
    const char* q = p + k;
    const char* digits = q;
    while (q < end && std::isdigit(static_cast<unsigned char>(*q))) ++q;
    if (q > digits && q < end && *q == ']') return true;
  }
  return false;
}

}  // namespace

std::string tag_lines(const std::string& lines, int rank) {
  const std::string tag = "[rank " + std::to_string(rank) + "] ";
  std::string out;
  out.reserve(lines.size() + lines.size() / 8);
  size_t start = 0;
  while (start < lines.size()) {
    size_t nl = lines.find('\n', start);
    size_t stop = nl == std::string::npos ? lines.size() : nl + 1;
    const char* b = lines.data() + start;
    if (!has_rank_tag(b, lines.data() + stop)) out += tag;
    out.append(b, stop - start);
    start = stop;
  }
  return out;
}

}  // namespace thetad::launch
