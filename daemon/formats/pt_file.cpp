// read_pt_file (see pt_file.hpp).
#include "daemon/formats/pt_file.hpp"

#include <limits>

#include "common/errors.hpp"
#include "common/text.hpp"
#include "daemon/formats/torch_zip_read.hpp"

namespace thetad::daemon {
namespace {

std::string list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

const ZipRecord& record(const ZipIndex& zip, const std::string& name, const char* data, bool check_crc,
                        const std::string& file) {
  const auto it = zip.records.find(name);
  if (it == zip.records.end())
    throw ConfigError(file + ": the archive has no record '" + printable(name) + "' (not a complete file of torch.save)");
  if (check_crc && !zip_crc_matches(data, it->second))
    throw ConfigError(file + ": record '" + printable(name) + "' does not match its CRC-32 (the file is damaged)");
  return it->second;
}

// The view's elements, from the start of its storage, contiguous; its bytes (overflow: max).
uint64_t view_bytes(const PtView& v, PtDtype dtype, const std::string& where) {
  for (size_t i = 0; i < v.sizes.size(); ++i)
    if (v.sizes[i] < 0 || v.strides[i] < 0)
      throw ConfigError(where + "sizes " + list(v.sizes) + ", strides " + list(v.strides) +
                        ": a negative size or stride");
  if (v.offset != 0)
    throw ConfigError(where + "storage offset " + std::to_string(v.offset) +
                      ", where thetad reads only tensors that begin their storage (a view of a larger "
                      "tensor: save a copy of it, t.clone())");
  uint64_t numel = 1;
  bool overflow = false;
  for (const int64_t size : v.sizes) {
    const auto d = static_cast<uint64_t>(size);
    overflow = overflow || (d != 0 && numel > std::numeric_limits<uint64_t>::max() / d);
    numel = overflow ? numel : numel * d;
  }
  if (numel != 0 && !overflow) {  // dimensions of size 1 may have any stride, as in PyTorch
    uint64_t expect = 1;
    for (size_t i = v.sizes.size(); i-- > 0;) {
      if (v.sizes[i] != 1 && static_cast<uint64_t>(v.strides[i]) != expect)
        throw ConfigError(where + "sizes " + list(v.sizes) + " with strides " + list(v.strides) +
                          " are not contiguous (save t.contiguous())");
      expect *= static_cast<uint64_t>(v.sizes[i]);
    }
  }
  const uint64_t item = pt_itemsize(dtype);
  return overflow || numel > std::numeric_limits<uint64_t>::max() / item ? std::numeric_limits<uint64_t>::max()
                                                                        : numel * item;
}

}  // namespace

std::vector<PtEntry> read_pt_file(const char* data, size_t size, const std::string& file, bool check_crc) {
  const ZipIndex zip = read_zip_index(data, size, file);
  const ZipRecord& pkl = record(zip, "data.pkl", data, check_crc, file);
  if (pkl.size > kPtMaxPickleBytes)
    throw ConfigError(file + ": data.pkl of " + std::to_string(pkl.size) + " bytes, above the " +
                      std::to_string(kPtMaxPickleBytes >> 20) + " MiB a state dict's pickle may have");
  const auto order = zip.records.find("byteorder");  // written by PyTorch 2: "little" or "big"
  if (order != zip.records.end() &&
      std::string(data + order->second.data_at, static_cast<size_t>(order->second.size)) != "little")
    throw ConfigError(file + ": saved in big-endian byte order; thetad reads little-endian files");
  const PtPickle p = parse_pt_pickle(data + pkl.data_at, static_cast<size_t>(pkl.size), file);
  std::vector<PtEntry> out;
  std::vector<bool> checked(p.storages.size(), false);
  for (const PtItem& item : p.items) {
    PtEntry e;
    e.key = item.key;
    e.key_is_string = item.key_is_string;
    e.kind = item.kind;
    e.is_tensor = item.view >= 0;
    if (e.is_tensor) {
      const PtView& v = p.views[static_cast<size_t>(item.view)];
      const PtStorage& st = p.storages[v.storage];
      const std::string where = file + ": tensor '" + printable(item.key) + "': ";
      const std::string name = "data/" + st.key;
      // An empty storage needs no record (LibTorch's reader reads none).
      const ZipRecord empty{};
      const ZipRecord& r = st.numel == 0 && !zip.records.count(name)
                               ? empty
                               : record(zip, name, data, check_crc && !checked[v.storage], file);
      checked[v.storage] = true;
      const uint64_t item_bytes = pt_itemsize(st.dtype);
      const auto numel = static_cast<uint64_t>(st.numel);
      if (numel > std::numeric_limits<uint64_t>::max() / item_bytes || numel * item_bytes != r.size)
        throw ConfigError(where + "its storage '" + printable(name) + "' holds " + std::to_string(r.size) +
                          " bytes, where the pickle says " + std::to_string(st.numel) + " " + pt_dtype_name(st.dtype) +
                          " values");
      e.tensor.dtype = st.dtype;
      e.tensor.shape = v.sizes;
      e.tensor.nbytes = view_bytes(v, st.dtype, where);
      if (e.tensor.nbytes > r.size)
        throw ConfigError(where + list(v.sizes) + " of " + pt_dtype_name(st.dtype) + " needs more than the " +
                          std::to_string(r.size) + " bytes of its storage");
      e.tensor.data_at = r.data_at;
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace thetad::daemon
