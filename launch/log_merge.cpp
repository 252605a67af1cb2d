// Line cutting, rank tagging and escaping of the merged log (see log_merge.hpp).
#include "launch/log_merge.hpp"

#include <cstring>

#include "common/text.hpp"

namespace thetad::launch {

std::string LineBuffer::feed(const char* data, size_t n) {
  std::string out;
  const char* end = data + n;
  while (data < end) {
    const size_t room = max_ - partial_.size();
    const auto* nl = static_cast<const char*>(std::memchr(data, '\n', size_t(end - data)));
    if (nl && size_t(nl - data) <= room) {  // a whole line
      if (!partial_.empty()) {
        out += partial_;
        partial_.clear();
      }
      out.append(data, size_t(nl + 1 - data));
      data = nl + 1;
      continue;
    }
    if (size_t(end - data) <= room && !nl) {  // the start of a line: wait for the rest
      partial_.append(data, size_t(end - data));
      break;
    }
    // Longer than a line may be: a full piece goes out now, marked, and the line goes on.
    partial_.append(data, room);
    data += room;
    out += partial_;
    out += kPartialMark;
    out += '\n';
    partial_.clear();
  }
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

// Whether the line [begin, end) starts with `tag` ("[rank R]"), at its very start or after one
// leading bracketed group and a space (thetad's time stamp: "[2026-01-02 03:04:05.678] ").
bool starts_with_tag(const char* begin, const char* end, const std::string& tag) {
  const auto at = [&](const char* p) {
    return size_t(end - p) >= tag.size() && std::memcmp(p, tag.data(), tag.size()) == 0;
  };
  if (at(begin)) return true;
  if (begin == end || *begin != '[') return false;
  constexpr size_t kStampMax = 64;
  for (const char* p = begin + 1; p < end && p < begin + kStampMax; ++p) {
    if (*p == '[') return false;
    if (*p == ']') return p + 1 < end && p[1] == ' ' && at(p + 2);
  }
  return false;
}

}  // namespace

std::string tag_lines(const std::string& lines, int rank) {
  const std::string own = "[rank " + std::to_string(rank) + "]";
  const std::string tag = own + " ";
  std::string out;
  out.reserve(lines.size() + lines.size() / 8);
  size_t start = 0;
  while (start < lines.size()) {
    size_t nl = lines.find('\n', start);
    size_t stop = nl == std::string::npos ? lines.size() : nl + 1;
    const char* b = lines.data() + start;
    if (!starts_with_tag(b, lines.data() + stop, own)) out += tag;
    out.append(b, stop - start);
    start = stop;
  }
  return out;
}

std::string escape_controls(const std::string& lines) { return printable(lines, LineBreaks::kKeep); }

}  // namespace thetad::launch
