// The PyTorch zip writer (daemon/checkpoint_format/torch_zip.hpp) and the block checksum: layout (64-byte
// aligned data, zip64 where sizes or offsets need it), CRCs against zlib, the checksum against
// file_checksum of the bytes, failures and cancellation, and Python's zipfile reading the result.
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "comm/bucket_plan.hpp"
#include "daemon/checkpoint_format/file_checksum.hpp"
#include "daemon/checkpoint_format/torch_zip.hpp"
#include "tests/daemon/test_util.hpp"

namespace thetad::daemon {
namespace {

uint32_t le32(const std::string& s, uint64_t at) {
  uint32_t v = 0;
  for (int b = 3; b >= 0; --b) v = (v << 8) | static_cast<unsigned char>(s[at + static_cast<uint64_t>(b)]);
  return v;
}

std::string random_bytes(size_t n, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(gen());
  return s;
}

// A sink into memory; `fail_after` writes succeed, then every write fails.
struct MemorySink {
  std::string bytes;
  std::mutex m;
  int writes = 0, fail_after = -1;
  TorchZipSink sink(int threads) {
    TorchZipSink s;
    s.threads = threads;
    s.write_at = [this](const char* p, size_t n, uint64_t off) {
      const std::lock_guard<std::mutex> lock(m);
      if (fail_after >= 0 && writes >= fail_after) return false;
      ++writes;
      if (bytes.size() < off + n) bytes.resize(off + n);
      std::memcpy(&bytes[off], p, n);
      return true;
    };
    return s;
  }
};

TEST(FileChecksum, BlocksCombinedAndWordHashInPieces) {
  const std::string data = random_bytes(2 * kChecksumBlock + 1001, 1);
  std::vector<uint64_t> blocks;
  for (uint64_t at = 0; at < data.size(); at += kChecksumBlock)
    blocks.push_back(comm::fnv1a64_words(data.data() + at, std::min<uint64_t>(kChecksumBlock, data.size() - at)));
  EXPECT_EQ(file_checksum(data.data(), data.size(), 1), combine_block_hashes(blocks));
  EXPECT_EQ(file_checksum(data.data(), data.size(), 4), combine_block_hashes(blocks));
  EXPECT_NE(file_checksum(data.data(), data.size() - 1), file_checksum(data.data(), data.size()));
  WordHash h;  // pieces of odd lengths give the words hash of the whole
  for (size_t at = 0, n = 1; at < 5000; at += n, n = n * 3 % 17 + 1) h.add(data.data() + at, std::min<size_t>(n, 5000 - at));
  EXPECT_EQ(h.value(), comm::fnv1a64_words(data.data(), 5000));
}

TEST(FileChecksum, BackgroundWriteTakesTheFewestThreadsThatFinishInTime) {
  const int64_t gb = 1000 * 1000 * 1000;
  // The LoRA job in bf16: 1.2 GB every 50 steps of ~65 ms (3.3 s) at 1 GB/s a thread: one.
  EXPECT_EQ(background_checkpoint_threads(gb * 6 / 5, 3.3, 1e9, 8), 1);
  // Half the interval is the budget: 4 GB in 4 s at 1 GB/s a thread needs 2 s each of 2 threads.
  EXPECT_EQ(background_checkpoint_threads(4 * gb, 4.0, 1e9, 8), 2);
  EXPECT_EQ(background_checkpoint_threads(4 * gb + 1, 4.0, 1e9, 8), 3);
  // More than the cores allow, or an interval not known yet (the first checkpoint): `most`.
  EXPECT_EQ(background_checkpoint_threads(32 * gb, 0.15, 1e9, 8), 8);
  EXPECT_EQ(background_checkpoint_threads(gb, 0.0, 1e9, 8), 8);
  EXPECT_EQ(background_checkpoint_threads(gb, 5.0, 0.0, 3), 3);
  // Nothing to write, or `most` below 1: one.
  EXPECT_EQ(background_checkpoint_threads(0, 5.0, 1e9, 8), 1);
  EXPECT_EQ(background_checkpoint_threads(gb, 0.0, 1e9, 0), 1);
}

TEST(TorchZip, LayoutAlignsDataAndNamesRecordsUnderArchive) {
  const TorchZipLayout l({{"data/0", 1000}, {"data/1", 0}, {"data.pkl", 77}, {"version", 2}});
  uint64_t end = 0;
  for (const TorchZipEntry& e : l.entries()) {
    EXPECT_EQ(e.data_at % 64, 0u) << e.name;
    EXPECT_EQ(e.header_at, end) << e.name;
    EXPECT_EQ(e.name.rfind("archive/", 0), 0u);
    end = e.data_at + e.size;
    const std::string h = l.local_header(&e - l.entries().data(), 0x12345678);
    EXPECT_EQ(h.size(), e.data_at - e.header_at);
    EXPECT_EQ(le32(h, 0), 0x04034b50u);
    EXPECT_EQ(le32(h, 14), 0x12345678u);
    EXPECT_EQ(h.substr(30, e.name.size()), e.name);
  }
  EXPECT_EQ(l.directory_at(), end);
}

TEST(TorchZip, Zip64WhereASizeOrAnOffsetNeedsIt) {
  const uint64_t big = uint64_t{5} << 30;
  const TorchZipLayout l({{"data/0", big}, {"data.pkl", 10}});
  const std::string h0 = l.local_header(0, 0);
  EXPECT_EQ(le32(h0, 18), 0xFFFFFFFFu);  // sizes in the zip64 field
  EXPECT_EQ(static_cast<unsigned char>(h0[4]), 45);
  EXPECT_EQ(l.entries()[1].data_at % 64, 0u);
  EXPECT_GT(l.entries()[1].header_at, big);
  const std::string d = l.directory({0, 0});
  EXPECT_EQ(le32(d, 42), 0u);  // entry 0's offset fits
  const size_t second = 46 + l.entries()[0].name.size() + 4 + 16;
  EXPECT_EQ(le32(d, second), 0x02014b50u);
  EXPECT_EQ(le32(d, second + 42), 0xFFFFFFFFu);  // entry 1's offset in its zip64 field
}

// Records of several blocks and tiny ones, written on 3 threads: CRCs as zlib computes them, the
// checksum that of the bytes, the prepare hook over every data byte once.
TEST(TorchZip, ParallelWriteMatchesZlibAndTheChecksum) {
  const std::string a = random_bytes(3 * kChecksumBlock + 12345, 2), b = random_bytes(100, 3), pkl = "pickle";
  const std::vector<TorchZipRecord> recs = {{"data/0", a.data(), a.size()}, {"data/1", b.data(), b.size()},
                                            {"data/2", nullptr, 0}, {"data.pkl", pkl.data(), pkl.size()},
                                            {"version", "3\n", 2}};
  MemorySink mem;
  TorchZipSink sink = mem.sink(3);
  std::atomic<uint64_t> prepared{0};
  sink.prepare = [&](size_t, uint64_t, uint64_t n) { prepared += n; };
  const TorchZipResult r = write_torch_zip(recs, sink);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(prepared.load(), a.size() + b.size() + pkl.size() + 2);
  ASSERT_EQ(mem.bytes.size(), r.size);
  EXPECT_EQ(r.checksum, file_checksum(mem.bytes.data(), mem.bytes.size()));
  std::vector<std::pair<std::string, uint64_t>> sizes;
  for (const auto& rec : recs) sizes.emplace_back(rec.name, rec.size);
  const TorchZipLayout l(sizes);
  for (size_t i = 0; i < recs.size(); ++i) {
    const TorchZipEntry& e = l.entries()[i];
    const uint32_t crc = static_cast<uint32_t>(crc32(0L, static_cast<const Bytef*>(recs[i].data), static_cast<uInt>(recs[i].size)));
    EXPECT_EQ(le32(mem.bytes, e.header_at + 14), crc) << e.name;
    if (recs[i].size > 0) {  // an empty record's data may be null (memcmp's arguments may not)
      EXPECT_EQ(std::memcmp(mem.bytes.data() + e.data_at, recs[i].data, recs[i].size), 0) << e.name;
    }
  }
  // The same records on one thread: the same bytes.
  MemorySink one;
  EXPECT_EQ(write_torch_zip(recs, one.sink(1)).checksum, r.checksum);
  EXPECT_EQ(one.bytes, mem.bytes);
  if (!test::have_python()) return;
  test::ScratchDir dir;
  const std::string path = dir.file("a.pt");
  std::ofstream(path, std::ios::binary).write(mem.bytes.data(), static_cast<std::streamsize>(mem.bytes.size()));
  EXPECT_TRUE(test::python_ok(
      "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); assert z.testzip() is None; "
      "n = [i.filename for i in z.infolist()]; "
      "assert n == [\"archive/data/\" + str(i) for i in range(3)] + [\"archive/data.pkl\", \"archive/version\"], n; "
      "assert z.read(\"archive/version\") == b\"3\\n\"", path));
}

TEST(TorchZip, AFailedWriteOrACancelStops) {
  const std::string a = random_bytes(2 * kChecksumBlock, 4);
  const std::vector<TorchZipRecord> recs = {{"data/0", a.data(), a.size()}, {"version", "3\n", 2}};
  MemorySink failing;
  failing.fail_after = 2;
  EXPECT_FALSE(write_torch_zip(recs, failing.sink(2)).ok);
  MemorySink cancelled;
  std::atomic<bool> cancel{true};
  TorchZipSink s = cancelled.sink(2);
  s.cancel = &cancel;
  EXPECT_FALSE(write_torch_zip(recs, s).ok);
  EXPECT_EQ(cancelled.writes, 0);
  MemorySink throwing;
  TorchZipSink t = throwing.sink(2);
  t.prepare = [](size_t, uint64_t, uint64_t) { throw Error("device copy failed"); };
  EXPECT_THROW(write_torch_zip(recs, t), Error);
}

// A zip64 archive (a 5 GiB record of zeros, the file sparse): Python's zipfile finds the record
// after it through the zip64 fields and reads it with its CRC checked.
TEST(TorchZip, Zip64ArchiveReadsInPython) {
  if (!test::have_python()) GTEST_SKIP() << "no /usr/bin/python3";
  const uint64_t big = (uint64_t{5} << 30) + 3;
  const TorchZipLayout l({{"data/0", big}, {"data.pkl", 6}});
  const std::string zeros(1 << 20, '\0');
  uLong zero_crc = crc32(0L, Z_NULL, 0);
  const uLong mib_crc = crc32(0L, reinterpret_cast<const Bytef*>(zeros.data()), 1 << 20);
  for (uint64_t i = 0; i < (big >> 20); ++i) zero_crc = crc32_combine(zero_crc, mib_crc, 1 << 20);
  zero_crc = crc32_combine(zero_crc, crc32(0L, reinterpret_cast<const Bytef*>(zeros.data()), 3), 3);
  const std::string pkl = "pickle";
  const std::vector<uint32_t> crcs = {static_cast<uint32_t>(zero_crc),
                                      static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(pkl.data()), 6))};
  test::ScratchDir dir;
  const std::string path = dir.file("big.pt");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  const auto put = [&](const std::string& s, uint64_t at) {
    ASSERT_EQ(::pwrite(fd, s.data(), s.size(), static_cast<off_t>(at)), static_cast<ssize_t>(s.size()));
  };
  put(l.local_header(0, crcs[0]), 0);
  put(l.local_header(1, crcs[1]), l.entries()[1].header_at);
  put(pkl, l.entries()[1].data_at);
  put(l.directory(crcs), l.directory_at());
  ::close(fd);
  EXPECT_TRUE(test::python_ok(
      "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); i = z.infolist(); "
      "assert [x.file_size for x in i] == [5 * 2**30 + 3, 6], i; assert i[1].header_offset > 2**32; "
      "assert z.read(\"archive/data.pkl\") == b\"pickle\"", path));
}

}  // namespace
}  // namespace thetad::daemon
