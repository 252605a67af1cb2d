// .npy header parsing and file mapping (MappedFile: reads out of the map are guarded). The parser walks the header with an explicit end
// pointer and checks every length before using it: it is run on arbitrary bytes by
// tests/fuzz/fuzz_npy_header.cpp.
#include "daemon/formats/npy.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "common/errors.hpp"

namespace thetad::daemon {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw ConfigError(file + ": " + what);
}

// A character for messages: printable as is, anything else as \xNN.
std::string show(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7f) return std::string("'") + c + "'";
  static const char* hex = "0123456789abcdef";
  return std::string("'\\x") + hex[u >> 4] + hex[u & 15] + "'";
}

// Cursor over the header text [p, end). peek() returns '\0' at the end; the header has been
// checked to contain no NUL byte, so '\0' unambiguously means "no more input".
class Cursor {
 public:
  Cursor(const char* p, const char* end, const std::string& file) : p_(p), end_(end), file_(file) {}

  char peek() const { return p_ < end_ ? *p_ : '\0'; }
  bool at_end() const { return p_ >= end_; }
  void skip_ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  void expect(char c, const std::string& context) {
    skip_ws();
    if (peek() != c) {
      fail(file_, std::string("malformed .npy header: expected '") + c + "' " + context + ", found " +
                      (at_end() ? std::string("the end of the header") : show(peek())));
    }
    ++p_;
  }
  // A Python string literal in single or double quotes, without escapes.
  std::string string_literal(const char* context) {
    skip_ws();
    const char q = peek();
    if (q != '\'' && q != '"')
      fail(file_, std::string("malformed .npy header: expected a quoted string ") + context + ", found " +
                      (at_end() ? std::string("the end of the header") : show(q)));
    ++p_;
    const char* start = p_;
    while (p_ < end_ && *p_ != q) {
      if (*p_ == '\\') fail(file_, "malformed .npy header: escape sequences are not supported in strings");
      ++p_;
    }
    if (p_ >= end_) fail(file_, std::string("malformed .npy header: unterminated string ") + context);
    std::string s(start, p_);
    ++p_;  // closing quote
    return s;
  }
  // An identifier such as True/False.
  std::string word() {
    skip_ws();
    const char* start = p_;
    while (p_ < end_ && ((*p_ >= 'a' && *p_ <= 'z') || (*p_ >= 'A' && *p_ <= 'Z') || *p_ == '_')) ++p_;
    return std::string(start, p_);
  }
  // A non-negative decimal integer (Python 2 writers may append 'L').
  int64_t integer(const char* context) {
    skip_ws();
    if (!(peek() >= '0' && peek() <= '9')) {
      if (peek() == '-') fail(file_, std::string("invalid shape: negative dimension ") + context);
      fail(file_, std::string("malformed .npy header: expected a non-negative integer ") + context +
                      ", found " + (at_end() ? std::string("the end of the header") : show(peek())));
    }
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      const int d = *p_ - '0';
      if (v > (std::numeric_limits<int64_t>::max() - d) / 10)
        fail(file_, std::string("invalid shape: dimension too large ") + context);
      v = v * 10 + d;
      ++p_;
    }
    if (peek() == 'L') ++p_;
    return v;
  }

 private:
  const char* p_;
  const char* end_;
  const std::string& file_;
};

// Validates a simple typestr: byte order, kind, item size.
void check_dtype(const std::string& d, const std::string& file) {
  auto bad = [&](const std::string& why) {
    fail(file, "unsupported dtype '" + d + "' in .npy header: " + why);
  };
  if (d.size() < 3 || d.size() > 4) bad("expected a typestr such as '<f4' or '<i8'");
  const char order = d[0];
  const char kind = d[1];
  if (order != '<' && order != '>' && order != '|') bad("byte order must be '<', '>' or '|'");
  if (kind == 'O') bad("object arrays (pickled data) are not supported");
  if (std::strchr("biufc", kind) == nullptr || kind == '\0')
    bad("only bool, integer, unsigned, float and complex element types are supported");
  size_t n = 0;
  for (size_t i = 2; i < d.size(); ++i) {
    if (d[i] < '0' || d[i] > '9') bad("item size must be a number");
    n = n * 10 + static_cast<size_t>(d[i] - '0');
  }
  bool ok = false;
  switch (kind) {
    case 'b': ok = n == 1; break;
    case 'i':
    case 'u': ok = n == 1 || n == 2 || n == 4 || n == 8; break;
    case 'f': ok = n == 2 || n == 4 || n == 8 || n == 16; break;
    case 'c': ok = n == 8 || n == 16 || n == 32; break;
  }
  if (!ok) bad("invalid item size for this element type");
  if (order == '|' && n != 1) bad("byte order '|' is only valid for 1-byte types");
}

}  // namespace

size_t npy_itemsize(const std::string& dtype) {
  size_t n = 0;
  for (size_t i = 2; i < dtype.size(); ++i) {
    if (dtype[i] < '0' || dtype[i] > '9') return 0;
    n = n * 10 + static_cast<size_t>(dtype[i] - '0');
  }
  return n;
}

std::string npy_dtype_name(const std::string& dtype) {
  if (dtype.size() < 3) return dtype;
  const std::string bits = std::to_string(npy_itemsize(dtype) * 8);
  switch (dtype[1]) {
    case 'b': return "bool";
    case 'i': return "int" + bits;
    case 'u': return "uint" + bits;
    case 'f': return "float" + bits;
    case 'c': return "complex" + bits;
  }
  return dtype;
}

std::string npy_shape_string(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + ")";
}

int64_t npy_numel(const std::vector<int64_t>& shape, const std::string& file) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) fail(file, "invalid shape " + npy_shape_string(shape) + ": negative dimension");
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d)
      fail(file, "invalid shape " + npy_shape_string(shape) + ": element count overflows");
    n *= d;
  }
  return n;
}

namespace {

// The prefix's length (magic, version, header length) and the header length it declares, checked
// against the file's `size`; reads only the first min(size, 12) bytes of `data`.
struct NpyPrefix {
  size_t prefix = 0, hlen = 0;
};

NpyPrefix parse_npy_prefix(const char* data, size_t size, const std::string& file) {
  if (data == nullptr || size < kMagicLen || std::memcmp(data, kMagic, kMagicLen) != 0)
    fail(file, "not a .npy file (missing the \\x93NUMPY magic)");
  if (size < 10) fail(file, "truncated .npy file: " + std::to_string(size) + " bytes, the header needs at least 10");
  const auto major = static_cast<unsigned char>(data[6]);
  const auto minor = static_cast<unsigned char>(data[7]);
  if (major < 1 || major > 3 || minor != 0)
    fail(file, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                   " (1.0, 2.0 and 3.0 are supported)");
  const auto* u = reinterpret_cast<const unsigned char*>(data);
  NpyPrefix p;
  if (major == 1) {
    p.prefix = 10;
    p.hlen = static_cast<size_t>(u[8]) | (static_cast<size_t>(u[9]) << 8);
  } else {
    p.prefix = 12;
    if (size < p.prefix)
      fail(file, "truncated .npy file: " + std::to_string(size) + " bytes, a version " +
                     std::to_string(major) + " header needs at least 12");
    p.hlen = static_cast<size_t>(u[8]) | (static_cast<size_t>(u[9]) << 8) |
             (static_cast<size_t>(u[10]) << 16) | (static_cast<size_t>(u[11]) << 24);
  }
  if (p.hlen > kNpyMaxHeaderLen)
    fail(file, "implausible .npy header length " + std::to_string(p.hlen) + " (limit " +
                   std::to_string(kNpyMaxHeaderLen) + ")");
  if (p.hlen > size - p.prefix)
    fail(file, "truncated .npy header: it declares " + std::to_string(p.hlen) + " bytes but only " +
                   std::to_string(size - p.prefix) + " follow");
  return p;
}

constexpr size_t kNpyLongestPrefix = 12;

}  // namespace

NpyHeader parse_npy_header(const char* data, size_t size, const std::string& file) {
  const NpyPrefix p = parse_npy_prefix(data, size, file);
  const size_t prefix = p.prefix, hlen = p.hlen;
  if (hlen == 0) fail(file, "malformed .npy header: empty header");

  const char* begin = data + prefix;
  const char* end = begin + hlen;
  for (const char* c = begin; c < end; ++c) {
    const auto b = static_cast<unsigned char>(*c);
    if (b == 0 || b >= 0x80)
      fail(file, "malformed .npy header: non-ASCII byte " + show(*c) + " at offset " +
                     std::to_string(c - data));
  }
  if (end[-1] != '\n') fail(file, "malformed .npy header: it does not end with a newline");

  NpyHeader h;
  bool have_descr = false, have_order = false, have_shape = false;
  Cursor cur(begin, end, file);
  cur.expect('{', "at the start of the header dict");
  for (;;) {
    cur.skip_ws();
    if (cur.peek() == '}') break;
    const std::string key = cur.string_literal("as a dict key");
    cur.expect(':', "after the key '" + key + "'");
    if (key == "descr") {
      if (have_descr) fail(file, "malformed .npy header: duplicate key 'descr'");
      cur.skip_ws();
      if (cur.peek() == '[') fail(file, "unsupported dtype in .npy header: structured dtypes are not supported");
      h.dtype = cur.string_literal("as the value of 'descr'");
      check_dtype(h.dtype, file);
      have_descr = true;
    } else if (key == "fortran_order") {
      if (have_order) fail(file, "malformed .npy header: duplicate key 'fortran_order'");
      const std::string w = cur.word();
      if (w == "True") h.fortran_order = true;
      else if (w == "False") h.fortran_order = false;
      else fail(file, "malformed .npy header: 'fortran_order' must be True or False");
      have_order = true;
    } else if (key == "shape") {
      if (have_shape) fail(file, "malformed .npy header: duplicate key 'shape'");
      cur.expect('(', "to start the 'shape' tuple");
      cur.skip_ws();
      bool trailing_comma = false;
      while (cur.peek() != ')') {
        if (h.shape.size() >= kNpyMaxDims)
          fail(file, "invalid shape: more than " + std::to_string(kNpyMaxDims) + " dimensions");
        h.shape.push_back(cur.integer("in 'shape'"));
        cur.skip_ws();
        trailing_comma = false;
        if (cur.peek() == ',') {
          cur.expect(',', "");
          cur.skip_ws();
          trailing_comma = true;
        } else if (cur.peek() != ')') {
          fail(file, "malformed .npy header: expected ',' or ')' in 'shape'");
        }
      }
      cur.expect(')', "to end the 'shape' tuple");
      // "(5)" is the integer 5 in Python, not a tuple; numpy writes "(5,)".
      if (h.shape.size() == 1 && !trailing_comma)
        fail(file, "malformed .npy header: 'shape' (" + std::to_string(h.shape[0]) +
                       ") is not a tuple (a 1-D shape is written (N,))");
      have_shape = true;
    } else {
      fail(file, "malformed .npy header: unexpected key '" + key +
                     "' (expected 'descr', 'fortran_order' and 'shape')");
    }
    cur.skip_ws();
    if (cur.peek() == ',') {
      cur.expect(',', "");
      continue;
    }
    if (cur.peek() != '}') fail(file, "malformed .npy header: expected ',' or '}' after a dict value");
  }
  cur.expect('}', "at the end of the header dict");
  cur.skip_ws();
  if (!cur.at_end()) fail(file, "malformed .npy header: unexpected text after the header dict");
  if (!have_descr) fail(file, "malformed .npy header: missing key 'descr'");
  if (!have_order) fail(file, "malformed .npy header: missing key 'fortran_order'");
  if (!have_shape) fail(file, "malformed .npy header: missing key 'shape'");

  // The byte size must be representable, so later size checks cannot overflow.
  const int64_t numel = npy_numel(h.shape, file);
  const auto item = static_cast<int64_t>(npy_itemsize(h.dtype));
  if (numel > (std::numeric_limits<int64_t>::max() - static_cast<int64_t>(prefix + hlen)) / item)
    fail(file, "invalid shape " + npy_shape_string(h.shape) + ": data size overflows");
  h.data_offset = prefix + hlen;
  return h;
}

// ---- NpyArray ---------------------------------------------------------------------------

NpyArray NpyArray::open(const std::string& path) {
  NpyArray a;
  a.map_ = MappedFile::open(path);  // missing, not a regular file (a FIFO included), empty
  const size_t size = a.map_.size();
  // The header copied out of the map (guarded reads) and parsed from the copy: its prefix first,
  // for the length it declares, then the prefix and the header whole.
  char first[kNpyLongestPrefix] = {};
  const size_t first_n = std::min(size, kNpyLongestPrefix);
  a.map_.read(".npy header", [&] { std::memcpy(first, a.map_.data(), first_n); });
  const NpyPrefix p = parse_npy_prefix(first, size, path);
  std::string head(p.prefix + p.hlen, '\0');
  char* to = head.data();
  a.map_.read(".npy header", [&] { std::memcpy(to, a.map_.data(), p.prefix + p.hlen); });
  a.header_ = parse_npy_header(head.data(), head.size(), path);
  const NpyHeader& h = a.header_;
  if (h.dtype[0] == '>')
    fail(path, "big-endian data ('" + h.dtype + "') is not supported; save it little-endian ('<" +
                   h.dtype.substr(1) + "')");
  if (h.fortran_order && h.shape.size() >= 2)
    fail(path, "Fortran-order arrays are not supported; save a C-contiguous array (np.ascontiguousarray)");
  a.numel_ = npy_numel(h.shape, path);
  a.itemsize_ = npy_itemsize(h.dtype);
  const size_t expected = h.data_offset + static_cast<size_t>(a.numel_) * a.itemsize_;
  if (size != expected)
    fail(path, "file size " + std::to_string(size) + " bytes does not match its header (shape " +
                   npy_shape_string(h.shape) + " of " + npy_dtype_name(h.dtype) + " needs " +
                   std::to_string(expected) + " bytes): the file is truncated or corrupt");
  return a;
}

void NpyArray::require_dtype(const std::string& dtype) const {
  if (header_.dtype != dtype)
    fail(path(), "expected " + npy_dtype_name(dtype) + " ('" + dtype + "'), found '" + header_.dtype + "'");
}

void NpyArray::require_ndim(size_t ndim) const {
  if (header_.shape.size() != ndim)
    fail(path(), "expected a " + std::to_string(ndim) + "-D array, found shape " +
                     npy_shape_string(header_.shape));
}

}  // namespace thetad::daemon
