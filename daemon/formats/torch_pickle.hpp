// The pickle of a PyTorch archive (data.pkl) read as the dict of tensors it should be, torch-free:
// a small machine of the opcodes of pickle protocol 2 that torch.save and LibTorch's pickler
// write, and of the few globals a state dict uses (_rebuild_tensor_v2, _rebuild_parameter, the
// storage types, OrderedDict, LibTorch's restore_type_tag). Anything else (another global such as
// os.system or builtins.eval, another opcode) is refused, as LibTorch's unpickler refuses unknown
// globals; unlike it, this machine bounds nesting, values and memo indices, and checks every
// argument's kind, so that no pickle can crash it or make it allocate beyond its input's size.
// Tensors come out as the pickle describes them; pt_file.hpp checks them against the records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace thetad::daemon {

enum class PtDtype : uint8_t { f32, f64, f16, bf16, i64, i32, i16, i8, u8, boolean };
size_t pt_itemsize(PtDtype t);
const char* pt_dtype_name(PtDtype t);  // "float32", ...

struct PtStorage {
  std::string key;  // its record: "data/" + key
  PtDtype dtype = PtDtype::f32;
  int64_t numel = 0;  // as the pickle says
};

struct PtView {
  uint32_t storage = 0;  // index into PtPickle::storages
  int64_t offset = 0;
  std::vector<int64_t> sizes, strides;
};

// A value of the top dict. Keys are strings or integers; values tensors or something else.
struct PtItem {
  std::string key;  // a string key, or an integer's decimal digits
  bool key_is_string = true;
  int64_t view = -1;  // index into PtPickle::views for a tensor, else -1
  std::string kind;   // what the value is, for messages: "a tensor", "an integer", "a tuple", ...
};

struct PtPickle {
  std::vector<PtItem> items;  // in the dict's order; a key given twice keeps its first place, its last value
  std::vector<PtStorage> storages;
  std::vector<PtView> views;
};

// Values nested deeper than this are refused (a state dict nests 4: the tensor's arguments).
constexpr size_t kPtMaxDepth = 64;
// A bound on the values built (about 25 per tensor of a state dict), so that memory stays a small
// multiple of the pickle's size whatever it holds.
constexpr size_t kPtMaxValues = size_t{1} << 24;
constexpr size_t kPtMaxDims = 64;

// Runs the pickle in [data, data + size). Throws ConfigError "FILE: ..." where it is not a dict
// pickled as above.
PtPickle parse_pt_pickle(const char* data, size_t size, const std::string& file);

}  // namespace thetad::daemon
