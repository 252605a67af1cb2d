// safetensors header parsing, dtype conversion, files and sharded checkpoints (see
// safetensors.hpp). The header parser is run on arbitrary bytes by the fuzzer: every length is
// checked before it is used, and JSON goes through nlohmann-json without exceptions.
#include "daemon/formats/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errors.hpp"
#include "common/file_read.hpp"
#include "common/json_read.hpp"
#include "common/test_hooks.hpp"
#include "common/text.hpp"

namespace thetad::daemon {
namespace {

// safetensors data is little-endian; F32 and BF16 are copied as the host's own bits.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors reading assumes a little-endian host");

using nlohmann::json;

[[noreturn]] void fail(const std::string& file, const std::string& what) { throw ConfigError(file + ": " + what); }

// A non-negative JSON integer that fits int64, else a ConfigError naming `what`.
uint64_t nonneg(const json& v, const std::string& file, const std::string& what) {
  if (!v.is_number_unsigned() || v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    fail(file, what + " must be a non-negative integer, found " + json_brief(v));
  return v.get<uint64_t>();
}

StTensor parse_tensor(const std::string& name, const json& v, size_t data_size, const std::string& file) {
  const std::string where = "safetensors tensor '" + printable(name) + "': ";
  if (!v.is_object()) fail(file, where + "expected an object {dtype, shape, data_offsets}");
  for (const auto& item : v.items())
    if (item.key() != "dtype" && item.key() != "shape" && item.key() != "data_offsets")
      fail(file, where + "unknown field '" + printable(item.key()) + "'");
  StTensor t;
  t.name = name;
  const auto d = v.find("dtype"), s = v.find("shape"), o = v.find("data_offsets");
  if (d == v.end() || !d->is_string()) fail(file, where + "no dtype string");
  t.dtype = d->get<std::string>();
  const size_t item = st_itemsize(t.dtype);
  if (item == 0) fail(file, where + "unknown dtype '" + printable(t.dtype.substr(0, 40)) + "'");
  if (s == v.end() || !s->is_array()) fail(file, where + "no shape list");
  if (s->size() > kStMaxDims) fail(file, where + std::to_string(s->size()) + " dimensions, more than " + std::to_string(kStMaxDims));
  for (const json& dim : *s) t.shape.push_back(static_cast<int64_t>(nonneg(dim, file, where + "a dimension")));
  if (o == v.end() || !o->is_array() || o->size() != 2) fail(file, where + "data_offsets must be a list [begin, end]");
  t.begin = nonneg((*o)[0], file, where + "data_offsets");
  t.end = nonneg((*o)[1], file, where + "data_offsets");
  if (t.begin > t.end || t.end > data_size)
    fail(file, where + "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                   ") out of range: the data section has " + std::to_string(data_size) + " bytes");
  const auto numel = static_cast<uint64_t>(st_numel(t.shape, file, name));
  if (numel > std::numeric_limits<uint64_t>::max() / item || numel * item != t.end - t.begin)
    fail(file, where + "shape " + st_shape_string(t.shape) + " of " + t.dtype + " needs " +
                   (numel > std::numeric_limits<uint64_t>::max() / item ? std::string("more") : std::to_string(numel * item)) +
                   " bytes, its data_offsets span " + std::to_string(t.end - t.begin));
  return t;
}

// IEEE half to float (subnormals, infinities and NaN included).
float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    exp = 113;
    while (!(man & 0x400u)) {
      man <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

size_t st_itemsize(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"U16", 2}, {"I16", 2},
      {"F16", 2},  {"BF16", 2}, {"U32", 4}, {"I32", 4},     {"F32", 4},     {"U64", 8}, {"I64", 8}, {"F64", 8}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

int64_t st_numel(const std::vector<int64_t>& shape, const std::string& file, const std::string& tensor) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d != 0 && n > std::numeric_limits<int64_t>::max() / d))
      fail(file, "safetensors tensor '" + printable(tensor) + "': shape " + st_shape_string(shape) + " overflows int64");
    n *= d;
  }
  return n;
}

std::string st_shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

StHeader parse_safetensors_header(const char* data, size_t size, const std::string& file) {
  if (size < 8)
    fail(file, "truncated safetensors file: " + std::to_string(size) + " bytes, fewer than the 8 of the header's length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(data[i]);
  if (n > kStMaxHeaderLen)
    fail(file, "safetensors header of " + std::to_string(n) + " bytes is above the format's limit of " +
                   std::to_string(kStMaxHeaderLen) + " (oversized, or not a safetensors file)");
  if (n > size - 8)
    fail(file, "truncated safetensors file: its header has " + std::to_string(n) + " bytes, the file " +
                   std::to_string(size - 8) + " after the length");
  JsonProblem problem;
  const json j = parse_json(data + 8, data + 8 + n, problem);
  if (problem != JsonProblem::none) fail(file, "safetensors header is " + json_problem_text(problem));
  if (!j.is_object()) fail(file, "safetensors header is not a JSON object");
  StHeader h;
  h.data_offset = 8 + static_cast<size_t>(n);
  const size_t data_size = size - h.data_offset;
  for (const auto& item : j.items()) {
    if (item.key() == "__metadata__") {
      if (!item.value().is_object()) fail(file, "safetensors __metadata__ is not an object");
      for (const auto& m : item.value().items()) {
        if (!m.value().is_string()) fail(file, "safetensors __metadata__ '" + printable(m.key()) + "' is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_tensor(item.key(), item.value(), data_size, file));
  }
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const StTensor& a, const StTensor& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  for (size_t i = 1; i < h.tensors.size(); ++i)
    if (h.tensors[i].begin < h.tensors[i - 1].end)
      fail(file, "safetensors tensors '" + printable(h.tensors[i - 1].name) + "' and '" + printable(h.tensors[i].name) +
                     "' overlap (bytes " +
                     std::to_string(h.tensors[i].begin) + " to " + std::to_string(h.tensors[i - 1].end) + ")");
  return h;
}

void st_to_fp32(const std::string& dtype, const void* src, size_t n, float* dst, const std::string& where) {
  const auto* p = static_cast<const unsigned char*>(src);
  if (dtype == "F32") {
    if (n > 0) std::memcpy(dst, p, n * 4);  // an empty tensor's pointers may be null
  } else if (dtype == "BF16") {
    // Little-endian host (x86, arm64): the bf16 bits are the float's upper half. In blocks through
    // aligned local buffers, which the compiler vectorizes (the mapped bytes may be unaligned).
    constexpr size_t kBlock = 1024;
    uint16_t in[kBlock];
    uint32_t out[kBlock];
    for (size_t b = 0; b < n; b += kBlock) {
      const size_t m = std::min(kBlock, n - b);
      std::memcpy(in, p + 2 * b, 2 * m);
      for (size_t i = 0; i < m; ++i) out[i] = uint32_t(in[i]) << 16;
      std::memcpy(dst + b, out, 4 * m);
    }
  } else if (dtype == "F16") {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      dst[i] = half_to_float(h);
    }
  } else {
    throw ConfigError(where + ": dtype " + dtype + " is not a floating-point type thetad reads (F32, BF16, F16)");
  }
}

namespace {

// The first of n values of type T whose exponent bits (`exp`) are all ones: NaN or infinity.
// Block by block through an aligned buffer, a branch-free test per block (vectorized).
template <typename T>
int64_t first_all_ones(const unsigned char* p, size_t n, T exp) {
  constexpr size_t kBlock = 1024;
  T buf[kBlock];
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(kBlock, n - b);
    std::memcpy(buf, p + b * sizeof(T), m * sizeof(T));
    bool any = false;
    for (size_t i = 0; i < m; ++i) any |= (buf[i] & exp) == exp;
    if (!any) continue;
    for (size_t i = 0; i < m; ++i)
      if ((buf[i] & exp) == exp) return static_cast<int64_t>(b + i);
  }
  return -1;
}

}  // namespace

int64_t st_first_nonfinite(const std::string& dtype, const void* src, size_t n) {
  const auto* p = static_cast<const unsigned char*>(src);
  if (dtype == "F32") return first_all_ones<uint32_t>(p, n, 0x7f800000u);
  if (dtype == "BF16") return first_all_ones<uint16_t>(p, n, 0x7f80u);
  if (dtype == "F16") return first_all_ones<uint16_t>(p, n, 0x7c00u);
  return -1;
}

std::string st_nonfinite_text(const std::string& dtype, const void* src, int64_t i) {
  return "value " + std::to_string(i) + " is " +
         st_nonfinite_word(dtype, static_cast<const unsigned char*>(src) + static_cast<size_t>(i) * st_itemsize(dtype));
}

std::string st_nonfinite_word(const std::string& dtype, const void* value) {
  float v = 0;
  st_to_fp32(dtype, value, 1, &v, "");
  return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
}

uint16_t st_fp32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

void st_to_bf16(const std::string& dtype, const void* src, size_t n, uint16_t* dst, const std::string& where) {
  const auto* p = static_cast<const unsigned char*>(src);
  if (dtype == "BF16") {
    if (n > 0) std::memcpy(dst, p, n * 2);  // an empty tensor's pointers may be null
    return;
  }
  if (dtype != "F32" && dtype != "F16")
    throw ConfigError(where + ": dtype " + dtype + " is not a floating-point type thetad reads (F32, BF16, F16)");
  // Through float32 in blocks (aligned local buffers; the mapped bytes may be unaligned).
  constexpr size_t kBlock = 1024;
  float wide[kBlock];
  const size_t item = dtype == "F32" ? 4 : 2;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(kBlock, n - b);
    st_to_fp32(dtype, p + item * b, m, wide, where);
    for (size_t i = 0; i < m; ++i) dst[b + i] = st_fp32_to_bf16(wide[i]);
  }
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.map_ = MappedFile::open(path);
  // The length and the header copied out of the map (guarded), then parsed from the copy.
  const MappedFile& map = f.map_;
  const size_t size = map.size();
  std::string head(std::min<size_t>(8, size), '\0');
  map.read("safetensors header", [&] { std::memcpy(head.data(), map.data(), head.size()); });
  uint64_t n = 0;
  for (size_t i = head.size(); i-- > 0;) n = (n << 8) | static_cast<unsigned char>(head[i]);
  if (size >= 8 && n <= kStMaxHeaderLen && n <= size - 8) {
    head.resize(8 + n);
    map.read("safetensors header", [&] { std::memcpy(head.data() + 8, map.data() + 8, n); });
  }
  f.header_ = parse_safetensors_header(head.data(), size, path);
  for (size_t i = 0; i < f.header_.tensors.size(); ++i) f.index_[f.header_.tensors[i].name] = i;
  if (test_hooks::truncate_mapped(path) && ::truncate(path.c_str(), static_cast<off_t>(f.header_.data_offset)) != 0)
    fail(path, std::string("THETAD_TEST_TRUNCATE_MAPPED: cannot truncate: ") + std::strerror(errno));
  return f;
}

std::string SafetensorsFile::tensor_text(const StTensor& t) { return "tensor '" + printable(t.name) + "'"; }

const StTensor* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

namespace {

// A file the model directory `dir` names (its index, a shard, model.safetensors): refused where
// it is a link that leaves the directory (a shard named "b.safetensors" pointing at /etc/shadow
// had its first bytes printed as a header's length).
std::string in_directory(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name;
  const std::string outside = link_outside(dir, name);
  if (!outside.empty()) fail(path, outside);
  return path;
}

}  // namespace

SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::string& path) {
  SafetensorsCheckpoint c;
  c.path_ = path;
  struct stat st {};
  // Whether `p` exists; an error other than "no such file" (a directory without permission) is
  // reported as it is, not taken for a missing file.
  const auto exists = [&st](const std::string& p) {
    if (::stat(p.c_str(), &st) == 0) return true;
    if (errno != ENOENT) fail(p, std::string("cannot read: ") + std::strerror(errno));
    return false;
  };
  if (!exists(path)) fail(path, "no such file or directory");
  std::map<std::string, std::string> weight_map;  // from the index: tensor -> file
  std::vector<std::string> files;
  if (!S_ISDIR(st.st_mode)) {
    files.push_back(path);
  } else if (exists(path + "/model.safetensors.index.json")) {
    const std::string index = in_directory(path, "model.safetensors.index.json");
    std::string text;
    const ReadResult read = read_regular_file(index, kMaxJsonFileBytes, text);
    if (!read) fail(index, read.why);
    JsonProblem problem;
    const json j = parse_json(text.data(), text.data() + text.size(), problem);
    if (problem != JsonProblem::none) fail(index, json_problem_text(problem));
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail(index, "expected a JSON object with a \"weight_map\" object {tensor: file}");
    std::set<std::string> seen;
    for (const auto& item : j["weight_map"].items()) {
      if (!item.value().is_string()) fail(index, "weight_map: tensor '" + printable(item.key()) + "' has no file name");
      const std::string f = item.value().get<std::string>();
      // A plain name (printable: messages quote the paths built from it).
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == ".." || printable(f) != f)
        fail(index, "weight_map: tensor '" + printable(item.key()) + "': '" + printable(f) +
                        "' is not a file name in the directory");
      weight_map[item.key()] = f;
      if (seen.insert(f).second) files.push_back(in_directory(path, f));
    }
    if (files.empty()) fail(index, "weight_map lists no tensor");
  } else if (exists(path + "/model.safetensors")) {
    files.push_back(in_directory(path, "model.safetensors"));
  } else {
    fail(path, "neither model.safetensors nor model.safetensors.index.json in the directory");
  }
  for (const std::string& f : files) {
    c.files_.push_back(std::make_shared<SafetensorsFile>(SafetensorsFile::open(f)));
    const size_t k = c.files_.size() - 1;
    for (const StTensor& t : c.files_[k]->header().tensors) {
      const auto [it, fresh] = c.where_.emplace(t.name, std::make_pair(k, &t));
      if (!fresh) fail(f, "tensor '" + printable(t.name) + "' is also in " + c.files_[it->second.first]->path());
    }
  }
  for (const auto& [name, f] : weight_map) {
    const auto it = c.where_.find(name);
    if (it == c.where_.end() || c.files_[it->second.first]->path() != path + "/" + f)
      fail(path + "/" + f, "tensor '" + printable(name) + "', listed there by model.safetensors.index.json, is not in the file");
  }
  return c;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& item : where_) out.push_back(item.first);
  return out;
}

const StTensor& SafetensorsCheckpoint::tensor(const std::string& name) const { return *where_of(name).second; }

const std::string& SafetensorsCheckpoint::file_of(const std::string& name) const {
  const auto it = where_.find(name);
  return it == where_.end() ? path_ : files_[it->second.first]->path();
}

const std::pair<size_t, const StTensor*>& SafetensorsCheckpoint::where_of(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) fail(path_, "tensor '" + printable(name) + "' is missing");
  return it->second;
}

void SafetensorsCheckpoint::read_fp32(const std::string& name, const std::vector<int64_t>& expect, float* dst) const {
  const StTensor& t = tensor(name);
  const SafetensorsFile& f = *files_[where_.at(name).first];
  if (t.shape != expect)
    fail(f.path(), "tensor '" + printable(name) + "' has shape " + st_shape_string(t.shape) + ", expected " +
                       st_shape_string(expect));
  const auto n = static_cast<size_t>(st_numel(t.shape, f.path(), name));
  const std::string where = f.path() + ": tensor '" + printable(name) + "'";
  f.read(t, [&](const char* bytes) { st_to_fp32(t.dtype, bytes, n, dst, where); });
}

}  // namespace thetad::daemon
