// Test helper: PyTorch archives (what torch.save writes) built byte by byte, so that a test can
// give a reader exactly the pickle and records it means to, well formed or crafted: a pickle
// writer of the opcodes torch.save and LibTorch's pickler use, state dicts in both their forms
// (a plain dict; Python's OrderedDict with its _metadata), and the zip around them (laid out by
// daemon/checkpoint_format/torch_zip.hpp, CRCs by zlib).
#pragma once

#include <zlib.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "daemon/checkpoint_format/torch_zip.hpp"

namespace thetad::test {

class Pickle {
 public:
  Pickle() { bytes_ += "\x80\x02"; }  // PROTO 2
  Pickle& op(char c) {
    bytes_ += c;
    return *this;
  }
  Pickle& raw(const std::string& s) {
    bytes_ += s;
    return *this;
  }
  Pickle& mark() { return op('('); }
  Pickle& tuple() { return op('t'); }
  // The smallest of BININT1, BININT2, BININT, LONG1 (8 bytes), as LibTorch's pickler picks.
  Pickle& integer(int64_t v) {
    if (v >= 0 && v < 256) return op('K').le(static_cast<uint64_t>(v), 1);
    if (v >= 0 && v < 65536) return op('M').le(static_cast<uint64_t>(v), 2);
    if (v >= INT32_MIN && v <= INT32_MAX) return op('J').le(static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    return op('\x8a').op('\x08').le(static_cast<uint64_t>(v), 8);
  }
  Pickle& str(const std::string& s) { return op('X').le(s.size(), 4).raw(s); }
  Pickle& global(const std::string& module, const std::string& name) { return op('c').raw(module + "\n" + name + "\n"); }
  Pickle& put(uint32_t memo) { return op('r').le(memo, 4); }
  Pickle& get(uint32_t memo) { return op('j').le(memo, 4); }
  Pickle& ints(const std::vector<int64_t>& v) {
    mark();
    for (int64_t x : v) integer(x);
    return tuple();
  }
  // torch._utils._rebuild_tensor_v2(storage, offset, sizes, strides, False, OrderedDict()) with
  // the persistent id ('storage', torch.<TYPE>, KEY, LOCATION, NUMEL).
  Pickle& tensor(const std::string& storage_type, const std::string& key, int64_t numel, int64_t offset,
                 const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                 const std::string& location = "cpu") {
    global("torch._utils", "_rebuild_tensor_v2").mark();
    mark().str("storage").global("torch", storage_type).str(key).str(location).integer(numel).tuple().op('Q');
    integer(offset).ints(sizes).ints(strides).op('\x89');
    return global("collections", "OrderedDict").op(')').op('R').tuple().op('R');
  }
  Pickle& stop() { return op('.'); }
  const std::string& bytes() const { return bytes_; }

 private:
  Pickle& le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes_ += static_cast<char>((v >> (8 * i)) & 0xff);
    return *this;
  }
  std::string bytes_;
};

// One tensor of a crafted state dict: its key, storage (type, record key, the numel the pickle
// claims) and view; the record's bytes are given separately.
struct CraftTensor {
  std::string key;
  std::string storage_type = "FloatStorage";
  std::string storage_key;
  int64_t numel = 0;  // the storage's, as the pickle says
  int64_t offset = 0;
  std::vector<int64_t> sizes, strides;
};

// The contiguous strides of `sizes`.
inline std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> s(sizes.size());
  int64_t n = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    s[i] = n;
    n *= sizes[i];
  }
  return s;
}

// The pickle of a state dict {key: tensor}: a plain dict (torch.save of a dict), or the
// OrderedDict that torch.save(model.state_dict()) writes, with its _metadata set by BUILD.
inline std::string state_dict_pickle(const std::vector<CraftTensor>& tensors, bool ordered = false) {
  Pickle p;
  if (ordered) p.global("collections", "OrderedDict").op(')').op('R');
  else p.op('}');
  p.put(0).mark();
  for (const CraftTensor& t : tensors)
    p.str(t.key).tensor(t.storage_type, t.storage_key, t.numel, t.offset, t.sizes,
                        t.strides.empty() && !t.sizes.empty() ? contiguous_strides(t.sizes) : t.strides);
  p.op('u');
  if (ordered) {  // {'_metadata': OrderedDict([('', {'version': 1})])}
    p.op('}').str("_metadata").global("collections", "OrderedDict").op(')').op('R');
    p.str("").op('}').str("version").integer(1).op('s').op('s').op('s').op('b');
  }
  return p.stop().bytes();
}

// A PyTorch archive: the records ("data/0", ...; "data.pkl" and "version" added) under
// "archive/", stored, 64-byte aligned, with their CRC-32s.
inline std::string pt_archive(const std::string& pickle, std::vector<std::pair<std::string, std::string>> records) {
  records.emplace_back("data.pkl", pickle);
  records.emplace_back("version", "3\n");
  std::vector<std::pair<std::string, uint64_t>> sizes;
  for (const auto& [name, bytes] : records) sizes.emplace_back(name, bytes.size());
  const daemon::TorchZipLayout layout(sizes);
  std::string out;
  std::vector<uint32_t> crcs;
  for (size_t i = 0; i < records.size(); ++i) {
    const std::string& data = records[i].second;
    crcs.push_back(static_cast<uint32_t>(
        ::crc32(0, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size()))));
    out += layout.local_header(i, crcs.back());
    out += data;
  }
  return out + layout.directory(crcs);
}

// `n` floats as bytes.
inline std::string float_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

}  // namespace thetad::test
