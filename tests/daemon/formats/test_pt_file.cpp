// read_pt_file: state dicts in PyTorch archives read strictly and torch-free. Every form the
// writers produce (torch.save of a dict or of model.state_dict(), LibTorch's pickler with its type
// tag, Parameters, shared storages, empty and 0-d tensors, tensors saved from a GPU), and every
// crafted file refused with a ConfigError naming the file and, where there is one, the tensor: a
// view outside its storage, a storage longer than its record, a global that is code, a pickle
// that would nest without bound or build a cycle, a damaged archive.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "daemon/formats/pt_file.hpp"
#include "../pt_craft.hpp"
#include "tests/daemon/test_util.hpp"

namespace thetad::daemon {
namespace {

using test::CraftTensor;
using test::Pickle;

std::vector<PtEntry> read(const std::string& bytes, bool crc = true) {
  return read_pt_file(bytes.data(), bytes.size(), "sd.pt", crc);
}

std::string error_of(const std::string& bytes, bool crc = true) {
  try {
    read(bytes, crc);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

// {"w": 2x3 float32 (storage "0"), "b": 3 float32 (storage "1")}.
std::vector<CraftTensor> two() {
  return {{"w", "FloatStorage", "0", 6, 0, {2, 3}, {}}, {"b", "FloatStorage", "1", 3, 0, {3}, {}}};
}
std::vector<std::pair<std::string, std::string>> two_records() {
  return {{"data/0", test::float_bytes({1, 2, 3, 4, 5, 6})}, {"data/1", test::float_bytes({7, 8, 9})}};
}

float at(const std::string& file, const PtEntry& e, size_t i) {
  float f;
  std::memcpy(&f, file.data() + e.tensor.data_at + 4 * i, 4);
  return f;
}

TEST(PtFile, ReadsBothStateDictForms) {
  for (const bool ordered : {false, true}) {
    const std::string f = test::pt_archive(test::state_dict_pickle(two(), ordered), two_records());
    const std::vector<PtEntry> e = read(f);
    ASSERT_EQ(e.size(), 2u);
    EXPECT_EQ(e[0].key, "w");
    EXPECT_TRUE(e[0].is_tensor);
    EXPECT_EQ(e[0].tensor.shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(e[0].tensor.nbytes, 24u);
    EXPECT_EQ(at(f, e[0], 5), 6.0f);
    EXPECT_EQ(e[1].key, "b");
    EXPECT_EQ(at(f, e[1], 0), 7.0f);
    EXPECT_EQ(e[0].tensor.data_at % 64, 0u);
  }
}

// LibTorch's pickler: restore_type_tag around the dict, an int64 storage, a 0-d tensor; a
// Parameter; two keys sharing one storage; an empty tensor without a record; a GPU's location;
// an integer key and a value that is not a tensor.
TEST(PtFile, ReadsWhatTheWritersWrite) {
  Pickle p;
  p.global("torch.jit._pickle", "restore_type_tag").op('}').put(0).mark();
  p.str("steps").tensor("LongStorage", "0", 1, 0, {}, {});
  p.str("shared_a").tensor("FloatStorage", "1", 3, 0, {3}, {1}, "cuda:0");
  p.str("shared_b").tensor("FloatStorage", "1", 3, 0, {1, 3}, {7, 1});  // size-1 dims take any stride
  p.str("param").global("torch._utils", "_rebuild_parameter").mark();
  p.tensor("BFloat16Storage", "2", 2, 0, {2}, {1}).op('\x88').global("collections", "OrderedDict").op(')').op('R');
  p.tuple().op('R');
  p.str("empty").tensor("FloatStorage", "9", 0, 0, {0, 4}, {4, 1});
  p.integer(7).str("seven");
  p.op('u').str("Dict[str, Tensor]").op('\x86').op('R').stop();
  const std::string f = test::pt_archive(
      p.bytes(), {{"data/0", std::string("\x05\0\0\0\0\0\0\0", 8)}, {"data/1", test::float_bytes({1, 2, 3})},
                  {"data/2", std::string(4, '\x3f')}});
  const std::vector<PtEntry> e = read(f);
  ASSERT_EQ(e.size(), 6u);
  EXPECT_EQ(e[0].tensor.dtype, PtDtype::i64);
  EXPECT_TRUE(e[0].tensor.shape.empty());
  EXPECT_EQ(e[0].tensor.nbytes, 8u);
  EXPECT_EQ(e[1].tensor.data_at, e[2].tensor.data_at);
  EXPECT_EQ(e[3].key, "param");
  EXPECT_EQ(e[3].tensor.dtype, PtDtype::bf16);
  EXPECT_EQ(e[4].tensor.nbytes, 0u);
  EXPECT_FALSE(e[5].key_is_string);
  EXPECT_EQ(e[5].key, "7");
  EXPECT_FALSE(e[5].is_tensor);
  EXPECT_EQ(e[5].kind, "a string");
}

TEST(PtFile, RefusesViewsOutsideTheirStorage) {
  struct Case {
    void (*change)(std::vector<CraftTensor>&, std::vector<std::pair<std::string, std::string>>&);
    const char* want;
  };
  const Case cases[] = {
      {[](auto& t, auto&) { t[0].offset = 24; }, "tensor 'w': storage offset 24, where thetad reads only"},
      {[](auto&, auto& r) { r[1].second.resize(4); }, "tensor 'b': its storage 'data/1' holds 4 bytes, where the pickle says 3 float32"},
      {[](auto& t, auto&) { t[0].strides = {int64_t{1} << 40, 1}; }, "tensor 'w': sizes [2, 3] with strides [1099511627776, 1] are not contiguous"},
      {[](auto& t, auto&) { t[0].strides = {1, 2}; }, "are not contiguous"},
      {[](auto& t, auto&) { t[1].strides = {-1}; }, "tensor 'b': sizes [3], strides [-1]: a negative size or stride"},
      {[](auto& t, auto&) { t[1].sizes = {4}; }, "tensor 'b': [4] of float32 needs more than the 12 bytes of its storage"},
      {[](auto& t, auto&) { t[1].sizes = {int64_t{1} << 62, 4}; t[1].strides = {4, 1}; }, "needs more than"},
      {[](auto& t, auto&) { t[1].storage_key = "7"; }, "the archive has no record 'data/7'"},
      {[](auto& t, auto&) { t[1].storage_type = "DoubleStorage"; t[1].storage_key = "0"; }, "storage '0' described twice, differently"},
      {[](auto& t, auto&) { t[1].numel = int64_t{1} << 62; }, "where the pickle says 4611686018427387904 float32"},
  };
  for (const Case& c : cases) {
    std::vector<CraftTensor> t = two();
    auto r = two_records();
    c.change(t, r);
    const std::string e = error_of(test::pt_archive(test::state_dict_pickle(t), r));
    EXPECT_EQ(e.rfind("sd.pt: ", 0), 0u) << e;
    EXPECT_NE(e.find(c.want), std::string::npos) << e;
  }
}

TEST(PtFile, RefusesPicklesThatAreNotStateDicts) {
  const auto archive = [](const Pickle& p) { return test::pt_archive(p.bytes(), {}); };
  const std::pair<Pickle, const char*> cases[] = {
      {Pickle().global("os", "system").str("echo owned").op('\x85').op('R').stop(), "global 'os.system' is not one a state dict"},
      {Pickle().global("builtins", "eval").stop(), "global 'builtins.eval'"},
      {Pickle().global("torch", "UntypedStorage").stop(), "global 'torch.UntypedStorage'"},
      {Pickle().op('}').str("x").op('s').stop(), "SETITEM finds no dict, key and value"},
      {Pickle().op('}').mark().str("x").integer(1).str("y").op('u').stop(), "key, value pairs"},
      {Pickle().op('}').mark().op(')').integer(1).op('u').stop(), "a dict key that is a tuple"},
      {Pickle().op(']').put(0).get(0).op('a').stop(), "a list placed in itself"},
      {Pickle().op(']').put(0).op(')').get(0).op('\x85').stop().raw(""), "values left"},
      {Pickle().op(']').put(0).op('\x85').get(0).integer(1).op('a').stop(), "changes a list already placed"},
      {Pickle().op('}').op('}').op('b').stop(), "BUILD on a dict that is not an OrderedDict"},
      {Pickle().get(3).stop(), "memo entry 3 was never put"},
      {Pickle().integer(1).op('\x8a').op('\x09').raw(std::string(9, '\0')).stop(), "wider than 64 bits"},
      {Pickle().op('X').raw("\xff\xff\xff\x7f").stop(), "runs past the end of the pickle"},
      {Pickle().op('}'), "the pickle ends inside an opcode's argument"},
      {Pickle().op('I').raw("1\n").stop(), "opcode 0x49 is not one of the pickle"},
      {Pickle().integer(5).stop(), "the pickle holds an integer, not a dict"},
      {Pickle().global("torch._utils", "_rebuild_tensor_v2").integer(1).op('\x85').op('R').stop(), "_rebuild_tensor_v2 takes"},
      {Pickle().mark().str("storage").global("torch", "FloatStorage").str("0").str("meta").integer(1).tuple().op('Q').stop(),
       "is on 'meta', not the host or a GPU"},
  };
  for (const auto& [p, want] : cases) {
    const std::string e = error_of(archive(p));
    EXPECT_EQ(e.rfind("sd.pt: data.pkl, byte ", 0), 0u) << want << ": " << e;
    EXPECT_NE(e.find(want), std::string::npos) << e;
  }
  std::string proto4 = test::state_dict_pickle(two());
  proto4[1] = 4;
  EXPECT_NE(error_of(test::pt_archive(proto4, two_records())).find("not pickle protocol 2"), std::string::npos);
}

TEST(PtFile, NestingIsBounded) {
  for (const size_t depth : {size_t{63}, size_t{64}, size_t{2000000}}) {
    Pickle p;
    p.op('}').mark().str("x");
    for (size_t i = 0; i < depth; ++i) p.op(']').mark();
    p.raw(std::string(depth, 'e')).op('u').stop();
    const std::string e = error_of(test::pt_archive(p.bytes(), {}));
    if (depth < 64) EXPECT_EQ(e, "(accepted)") << depth;
    else EXPECT_NE(e.find("values nested deeper than 64 levels"), std::string::npos) << depth << ": " << e;
  }
}

TEST(PtFile, RefusesDamagedArchives) {
  const std::string good = test::pt_archive(test::state_dict_pickle(two()), two_records());
  EXPECT_EQ(error_of(good), "(accepted)");
  const auto with = [&](size_t at, const std::string& bytes) {
    std::string f = good;
    f.replace(at, bytes.size(), bytes);
    return f;
  };
  // A flipped data byte: a CRC mismatch where the file has no checksum of its own.
  const std::vector<PtEntry> e = read(good);
  const std::string flipped = with(e[1].tensor.data_at, "\x01");
  EXPECT_NE(error_of(flipped).find("record 'data/1' does not match its CRC-32"), std::string::npos);
  EXPECT_EQ(error_of(flipped, /*crc=*/false), "(accepted)");
  EXPECT_NE(error_of(good.substr(0, good.size() - 30)).find("no zip end record"), std::string::npos);
  EXPECT_NE(error_of("").find("fewer than a zip end record"), std::string::npos);
  EXPECT_NE(error_of(std::string(100, 'x')).find("no zip end record"), std::string::npos);
  // The first local header: compressed (method 8) in the directory; a central header's name.
  const size_t dir = good.find("PK\x01\x02");
  ASSERT_NE(dir, std::string::npos);
  EXPECT_NE(error_of(with(dir + 10, "\x08")).find("compressed (method 8)"), std::string::npos);
  EXPECT_NE(error_of(with(dir + 8, "\x01")).find("encrypted"), std::string::npos);
  // The first record's name in the directory changed: its local header names another.
  EXPECT_NE(error_of(with(dir + 46, "z")).find("record 'zrchive/data/0': its local header names another record"),
            std::string::npos)
      << error_of(with(dir + 46, "z"));
  // Local header offset pointing into another record's bytes.
  EXPECT_NE(error_of(with(dir + 42, std::string("\x40\0\0\0", 4))).find("no local header"), std::string::npos);
  // A big-endian archive of PyTorch 2.
  auto records = two_records();
  records.emplace_back("byteorder", "big");
  EXPECT_NE(error_of(test::pt_archive(test::state_dict_pickle(two()), records)).find("big-endian"), std::string::npos);
  records.back().second = "little";
  EXPECT_EQ(error_of(test::pt_archive(test::state_dict_pickle(two()), records)), "(accepted)");
  // Two records of one name.
  records = two_records();
  records.push_back(records[0]);
  EXPECT_NE(error_of(test::pt_archive(test::state_dict_pickle(two()), records)).find("named twice"), std::string::npos);
}

// Files torch.save wrote (PyTorch 1.13, kept with the fuzzer's seeds): model.state_dict() with
// tied weights (one storage), bf16 and a 0-d int64 tensor; a dict with a float16 tensor and a
// Parameter; a view of a larger tensor (refused by name). And a checkpoint file of thetad's.
TEST(PtFile, ReadsPythonTorchSave) {
  const std::string seeds = std::string(THETAD_SOURCE_DIR) + "/tests/fuzz/corpus/pt/";
  const std::string bytes = test::read_file(seeds + "torch-save-state-dict.pt");
  const std::vector<PtEntry> e = read(bytes);
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(e[0].key, "0.weight");
  EXPECT_EQ(e[1].key, "1.weight");
  EXPECT_EQ(e[0].tensor.data_at, e[1].tensor.data_at);
  EXPECT_EQ(e[0].tensor.shape, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(e[2].tensor.dtype, PtDtype::bf16);
  EXPECT_EQ(e[3].tensor.dtype, PtDtype::i64);
  EXPECT_TRUE(e[3].tensor.shape.empty());
  const std::vector<PtEntry> plain = read(test::read_file(seeds + "torch-save-plain.pt"));
  ASSERT_EQ(plain.size(), 3u);
  EXPECT_EQ(plain[1].tensor.dtype, PtDtype::f16);
  EXPECT_EQ(plain[2].key, "p");
  EXPECT_TRUE(plain[2].is_tensor);
  const std::string v = error_of(test::read_file(seeds + "torch-save-view.pt"));
  EXPECT_NE(v.find("tensor 'v': storage offset 1"), std::string::npos) << v;
  // A checkpoint shard of thetad (LibTorch's pickler, restore_type_tag; daemon/checkpoint_format/torch_zip).
  const std::vector<PtEntry> shard = read(test::read_file(seeds + "thetad-checkpoint-shard.pt"), false);
  ASSERT_EQ(shard.size(), 6u);
  EXPECT_EQ(shard[0].key, "param");
  EXPECT_EQ(shard[5].key, "steps");
  EXPECT_EQ(shard[5].tensor.dtype, PtDtype::i64);
}

}  // namespace
}  // namespace thetad::daemon
