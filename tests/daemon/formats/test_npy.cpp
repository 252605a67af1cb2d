// .npy reading: real files written byte by byte (v1 and v2 headers, f4/i8, 1-D/2-D) and every
// kind of malformation, each of which must be a ConfigError naming the file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/errors.hpp"
#include "daemon/formats/npy.hpp"
#include "tests/daemon/test_util.hpp"

namespace thetad::daemon {
namespace {

using test::expect_config_error;
using test::npy_bytes;
using test::raw_bytes;
using test::put;

TEST(Npy, Float32TwoDimV1) {
  test::ScratchDir dir;
  const std::string path = dir.file("task3_x.npy");
  const std::vector<float> v = {1, 2, 3, 4, 5, 6};
  put(path, npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", raw_bytes(v)));
  NpyArray a = NpyArray::open(path);
  EXPECT_EQ(a.dtype(), "<f4");
  EXPECT_EQ(a.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.numel(), 6);
  EXPECT_EQ(a.itemsize(), 4u);
  EXPECT_EQ(a.header().data_offset, 128u);  // 10/12-byte prefix + dict padded to 64
  EXPECT_FALSE(a.header().fortran_order);
  EXPECT_EQ(std::memcmp(a.data(), v.data(), 24), 0);
  EXPECT_FLOAT_EQ(a.data_as<float>()[5], 6.0f);
  a.require_dtype("<f4");
  a.require_ndim(2);
  expect_config_error([&] { a.require_dtype("<i8"); }, "task3_x.npy", "expected int64 ('<i8'), found '<f4'");
  expect_config_error([&] { a.require_ndim(1); }, "task3_x.npy", "expected a 1-D array, found shape (2, 3)");

  NpyArray b = std::move(a);  // move-only RAII: the mapping travels
  EXPECT_EQ(b.data_as<float>()[0], 1.0f);
  EXPECT_EQ(a.data(), nullptr);
}

TEST(Npy, Int64OneDimV2AndDoubleQuotes) {
  test::ScratchDir dir;
  const std::string path = dir.file("task0_y.npy");
  const std::vector<int64_t> v = {7, -1, 42};
  put(path, npy_bytes("{\"descr\": \"<i8\", \"shape\": (3,), \"fortran_order\": False}", raw_bytes(v), 2));
  NpyArray a = NpyArray::open(path);
  EXPECT_EQ(a.dtype(), "<i8");
  EXPECT_EQ(a.shape(), (std::vector<int64_t>{3}));
  EXPECT_EQ(a.header().data_offset, 128u);  // 10/12-byte prefix + dict padded to 64
  EXPECT_EQ(a.data_as<int64_t>()[2], 42);
  a.require_ndim(1);
  expect_config_error([&] { a.require_dtype("<f4"); }, "task0_y.npy", "expected float32 ('<f4'), found '<i8'");
}

TEST(Npy, EmptyScalarAndOneDimFortran) {
  const std::string f = "x.npy";
  auto h = [&](const std::string& dict) {
    const std::string b = npy_bytes(dict, "");
    return parse_npy_header(b.data(), b.size(), f);
  };
  EXPECT_TRUE(h("{'descr': '<f4', 'fortran_order': False, 'shape': ()}").shape.empty());
  EXPECT_EQ(h("{'descr': '<f8', 'fortran_order': False, 'shape': (0, 4)}").shape, (std::vector<int64_t>{0, 4}));
  EXPECT_TRUE(h("{'descr': '|u1', 'fortran_order': True, 'shape': (5,)}").fortran_order);
  EXPECT_EQ(h("{'descr': '<i4', 'fortran_order': False, 'shape': (5L, 2L)}").shape, (std::vector<int64_t>{5, 2}));

  // A 1-D Fortran-order array is laid out like a C one, so it opens.
  test::ScratchDir dir;
  put(dir.file("f.npy"), npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2,)}", raw_bytes(std::vector<float>{1, 2})));
  EXPECT_EQ(NpyArray::open(dir.file("f.npy")).numel(), 2);
}

TEST(Npy, MalformedHeaders) {
  const std::string f = "bad.npy";
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  auto parse = [&](const std::string& bytes) { return parse_npy_header(bytes.data(), bytes.size(), f); };
  auto with_dict = [&](const std::string& dict) { return [&, dict] { parse(npy_bytes(dict, "")); }; };

  std::string bad_magic = npy_bytes(ok, "");
  bad_magic[1] = 'X';
  expect_config_error([&] { parse(bad_magic); }, f, "magic");
  expect_config_error([&] { parse(""); }, f, "magic");
  expect_config_error([&] { parse("\x93NUMPY\x01"); }, f, "truncated");
  std::string v9 = npy_bytes(ok, "");
  v9[6] = 9;
  expect_config_error([&] { parse(v9); }, f, "version 9.0");
  const std::string full = npy_bytes(ok, "");
  expect_config_error([&] { parse(full.substr(0, 40)); }, f, "truncated");
  expect_config_error([&] { parse(npy_bytes(ok, "", 2).substr(0, 11)); }, f, "truncated");

  expect_config_error(with_dict("{'descr': '<f4', 'fortran_order': False}"), f, "missing key 'shape'");
  expect_config_error(with_dict("{'descr': '<f4', 'shape': (1,)}"), f, "missing key 'fortran_order'");
  expect_config_error(with_dict("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (1,)}"), f, "True or False");
  expect_config_error(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}"), f, "unexpected key 'x'");
  expect_config_error(with_dict("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}"), f, "duplicate key");
  expect_config_error(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)"), f, "expected ',' or '}'");
  expect_config_error(with_dict("{'descr': '<f4, 'fortran_order': False, 'shape': (1,)}"), f, "dtype '<f4, '");
  expect_config_error(with_dict("['descr', '<f4']"), f, "expected '{'");
  expect_config_error(with_dict("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}"), f, "structured");
  expect_config_error(with_dict("{'descr': '|O', 'fortran_order': False, 'shape': (1,)}"), f, "unsupported dtype");
  expect_config_error(with_dict("{'descr': '<f3', 'fortran_order': False, 'shape': (1,)}"), f, "item size");
  expect_config_error(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} trailing"), f, "after the header dict");

  // Wrong shapes.
  expect_config_error(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}"), f, "negative");
  expect_config_error(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (3)}"), f, "not a tuple");
  expect_config_error(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (3 4)}"), f, "shape");
  expect_config_error(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}"), f, "too large");
  expect_config_error(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}"), f, "overflows");
  expect_config_error(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3]}"), f, "'('");

  // No newline at the end, NUL and non-ASCII bytes in the header.
  std::string no_nl = npy_bytes(ok, "");
  no_nl.back() = ' ';
  expect_config_error([&] { parse(no_nl); }, f, "newline");
  std::string nul = npy_bytes(ok, "");
  nul[20] = '\0';
  expect_config_error([&] { parse(nul); }, f, "non-ASCII");
}

TEST(Npy, FileLevelErrors) {
  test::ScratchDir dir;
  const std::vector<float> six = {1, 2, 3, 4, 5, 6};

  expect_config_error([&] { NpyArray::open(dir.file("missing_x.npy")); }, "missing_x.npy", "cannot open");

  put(dir.file("short.npy"), npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4)}", raw_bytes(six)));
  expect_config_error([&] { NpyArray::open(dir.file("short.npy")); }, "short.npy", "does not match its header");
  put(dir.file("long.npy"), npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (5,)}", raw_bytes(six)));
  expect_config_error([&] { NpyArray::open(dir.file("long.npy")); }, "long.npy", "does not match its header");

  put(dir.file("fortran.npy"), npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3)}", raw_bytes(six)));
  expect_config_error([&] { NpyArray::open(dir.file("fortran.npy")); }, "fortran.npy", "Fortran-order");

  put(dir.file("big.npy"), npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (6,)}", raw_bytes(six)));
  expect_config_error([&] { NpyArray::open(dir.file("big.npy")); }, "big.npy", "big-endian");

  put(dir.file("empty.npy"), "");
  expect_config_error([&] { NpyArray::open(dir.file("empty.npy")); }, "empty.npy", "empty file");
  put(dir.file("text.npy"), "hello, this is not numpy\n");
  expect_config_error([&] { NpyArray::open(dir.file("text.npy")); }, "text.npy", "magic");
}

// A file written by numpy itself, when Debian's python3-numpy is around.
TEST(Npy, ReadsNumpyOutput) {
  if (!test::have_python() || std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0)
    GTEST_SKIP() << "/usr/bin/python3 with numpy not available";
  test::ScratchDir dir;
  const std::string path = dir.file("np.npy");
  ASSERT_TRUE(test::python_ok("import numpy as np,sys; np.save(sys.argv[1], np.arange(12, dtype=np.float32).reshape(3, 4))", path));
  NpyArray a = NpyArray::open(path);
  a.require_dtype("<f4");
  EXPECT_EQ(a.shape(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(a.data_as<float>()[11], 11.0f);
}

// A file shortened by another process while it is mapped: a read out of it is a ConfigError
// naming the file (not SIGBUS), a file replaced under its name leaves the mapped one readable.
TEST(Npy, ReadOfAFileShortenedWhileMappedNamesIt) {
  test::ScratchDir dir;
  const std::string path = dir.file("task0_x.npy");
  const std::vector<float> v(64 << 10, 0.25f);  // 256 KiB: pages past the header's
  put(path, npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (16384, 4), }", raw_bytes(v)));
  const NpyArray a = NpyArray::open(path);
  std::vector<float> out(v.size());
  a.read("rows", [&] { std::memcpy(out.data(), a.data(), a.nbytes()); });
  EXPECT_EQ(out.back(), 0.25f);
  ASSERT_EQ(::truncate(path.c_str(), 128), 0);
  expect_config_error([&] { a.read("rows", [&] { std::memcpy(out.data(), a.data(), a.nbytes()); }); }, path,
                      "rows: cannot be read: the file is now 128 bytes");
  // Within the page the new end falls in (zeros there, no fault): found by the file's size.
  expect_config_error([&] { a.read("rows", [&] { std::memcpy(out.data(), a.data(), 16); }); }, path, "cannot be read");

  const std::string other = dir.file("task1_x.npy");
  put(other, npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (16384, 4), }", raw_bytes(v)));
  const NpyArray b = NpyArray::open(other);
  put(dir.file("new.npy"), npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 4), }", raw_bytes(std::vector<float>(4))));
  ASSERT_EQ(::rename(dir.file("new.npy").c_str(), other.c_str()), 0);
  b.read("rows", [&] { std::memcpy(out.data(), b.data(), b.nbytes()); });
  EXPECT_EQ(out.back(), 0.25f);
}

// Written into in place while mapped, at the same size: the private map would show the new bytes
// of every page not yet read, so the next read is a ConfigError naming the file.
TEST(Npy, ReadOfAFileWrittenInPlaceWhileMappedNamesIt) {
  test::ScratchDir dir;
  const std::string path = dir.file("task0_x.npy");
  const std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (16384, 4), }";
  put(path, npy_bytes(header, raw_bytes(std::vector<float>(64 << 10, 0.25f))));
  const NpyArray a = NpyArray::open(path);
  std::vector<float> out(a.nbytes() / 4);
  a.read("rows", [&] { std::memcpy(out.data(), a.data(), a.nbytes()); });
  EXPECT_EQ(out.back(), 0.25f);
  test::write_in_place(path, npy_bytes(header, raw_bytes(std::vector<float>(64 << 10, 0.75f))));
  expect_config_error([&] { a.read("rows", [&] { std::memcpy(out.data(), a.data(), 16); }); }, path,
                      "rows: cannot be read: the file was modified after thetad opened it");
}

// A job maps a file or two per task, thousands: a mapped file holds no descriptor.
TEST(Npy, AMappedFileHoldsNoDescriptor) {
  test::ScratchDir dir;
  const std::string path = dir.file("x.npy");
  put(path, npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", raw_bytes(std::vector<float>{1, 2})));
  const auto descriptors = [] {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
    return n;
  };
  const size_t before = descriptors();
  std::vector<NpyArray> maps;
  for (int i = 0; i < 32; ++i) maps.push_back(NpyArray::open(path));
  EXPECT_EQ(descriptors(), before);
  float first = 0;
  maps.back().read("x", [&] { first = maps.back().data_as<float>()[0]; });
  EXPECT_EQ(first, 1.0f);
}

}  // namespace
}  // namespace thetad::daemon
