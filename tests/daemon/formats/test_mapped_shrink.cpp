// A safetensors file shortened by another process while it is mapped: every read out of the map
// is a ConfigError naming the file and the tensor, on whichever thread reads (not SIGBUS, which
// killed the process with no word of the file), and a SIGBUS that is not such a read still kills.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/errors.hpp"
#include "daemon/formats/mapped_file.hpp"
#include "daemon/formats/safetensors.hpp"
#include "tests/daemon/test_util.hpp"

namespace thetad::daemon {
namespace {

using test::expect_config_error;

constexpr int64_t kBig = 64 << 10;  // floats: 256 KiB a tensor, pages past the first

// A file with a small tensor (in the first page, beside the header) and `big` tensors of kBig
// F32 values each; returns where the data section starts.
size_t write_file(const std::string& path, int big) {
  static const std::vector<float> values(kBig, 0.5f);
  std::vector<StWriteTensor> ts = {{"small", "F32", {4}, values.data(), 16}};
  for (int i = 0; i < big; ++i)
    ts.push_back({"big" + std::to_string(i), "F32", {kBig}, values.data(), values.size() * 4});
  write_safetensors(path, ts);
  const std::string bytes = test::read_file(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return static_cast<size_t>(8 + n);
}

TEST(MappedShrink, ReadOfATruncatedFileNamesTheFileAndTheTensor) {
  test::ScratchDir dir;
  const std::string path = dir.file("base.safetensors");
  const size_t data_offset = write_file(path, 2);
  const SafetensorsCheckpoint ck = SafetensorsCheckpoint::open(path);
  std::vector<float> out(kBig);
  ck.read_fp32("big1", {kBig}, out.data());  // whole: read as before
  EXPECT_EQ(out[kBig - 1], 0.5f);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(data_offset)), 0);
  // Past the first page: the copy faults (SIGBUS), caught.
  expect_config_error([&] { ck.read_fp32("big1", {kBig}, out.data()); }, path,
                      "tensor 'big1': cannot be read: the file is now " + std::to_string(data_offset) + " bytes");
  // Within the page the new end falls in (zeros there, no fault): found by the file's size.
  expect_config_error([&] { ck.read_fp32("small", {4}, out.data()); }, path, "tensor 'small': cannot be read");
  // Raw bytes likewise.
  expect_config_error([&] { ck.read("big0", [&](const char* bytes) { std::memcpy(out.data(), bytes, 4 * kBig); }); },
                      path, "tensor 'big0': cannot be read");
}

TEST(MappedShrink, EveryReaderThreadGetsItsError) {
  test::ScratchDir dir;
  const std::string path = dir.file("shards.safetensors");
  constexpr int kThreads = 4;
  const size_t data_offset = write_file(path, kThreads);
  const SafetensorsCheckpoint ck = SafetensorsCheckpoint::open(path);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(data_offset)), 0);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      std::vector<float> out(kBig);
      for (int round = 0; round < 20; ++round) {
        try {
          ck.read_fp32("big" + std::to_string(i), {kBig}, out.data());
          errors[i] = "read whole";
          return;
        } catch (const ConfigError& e) {
          errors[i] = e.what();
        }
      }
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i)
    EXPECT_NE(errors[i].find(path + ": tensor 'big" + std::to_string(i) + "': cannot be read"), std::string::npos)
        << errors[i];
  // The process reads on: a whole file after the faults.
  const std::string other = dir.file("whole.safetensors");
  write_file(other, 1);
  std::vector<float> out(kBig);
  SafetensorsCheckpoint::open(other).read_fp32("big0", {kBig}, out.data());
  EXPECT_EQ(out[0], 0.5f);
}

TEST(MappedShrink, TheHeaderReadIsGuardedToo) {
  test::ScratchDir dir;
  const std::string path = dir.file("m.bin");
  write_file(path, 1);
  const MappedFile map = MappedFile::open(path);
  ASSERT_EQ(::truncate(path.c_str(), 0), 0);
  char head[8];
  expect_config_error([&] { map.read("safetensors header", [&] { std::memcpy(head, map.data(), 8); }); }, path,
                      "safetensors header: cannot be read: the file is now 0 bytes");
}

// A page of `path` past its end, mapped outside any MappedFile.
const char* shortened_mapping(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  void* m = ::mmap(nullptr, 4 * kBig, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED || ::truncate(path.c_str(), 0) != 0) return nullptr;
  return static_cast<const char*>(m) + 8 * 4096;
}

// Dies of the SIGBUS: by its default action, or under AddressSanitizer or ThreadSanitizer, whose
// handler was the action before the guard's, by the sanitizer's report.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define THETAD_SIGBUS_REPORTED 1
#endif
bool died_of_sigbus(int status) {
#ifdef THETAD_SIGBUS_REPORTED
  return WIFEXITED(status) && WEXITSTATUS(status) != 0;
#else
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS;
#endif
}
#ifdef THETAD_SIGBUS_REPORTED
constexpr const char* kDeathSays = "Sanitizer: BUS";
#else
constexpr const char* kDeathSays = "";
#endif

TEST(MappedShrinkDeathTest, ASigbusOutsideTheGuardedMappingStillKills) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  test::ScratchDir dir;
  const std::string path = dir.file("m.safetensors"), other = dir.file("other.safetensors");
  write_file(path, 1);
  write_file(other, 1);
  const MappedFile map = MappedFile::open(path);
  char c = 0;
  map.read("warm-up", [&] { c = map.data()[0]; });  // the handler is installed from here on
  // A fault in another mapping, though inside a guarded read of this one.
  EXPECT_EXIT(
      {
        const char* gone = shortened_mapping(other);
        map.read("x", [&] { c = *static_cast<const volatile char*>(gone); });
      },
      died_of_sigbus, kDeathSays);
  // A fault outside any guarded read.
  EXPECT_EXIT({ c = *static_cast<const volatile char*>(shortened_mapping(other)); }, died_of_sigbus, kDeathSays);
  // SIGBUS sent to the process.
  EXPECT_EXIT({ ::raise(SIGBUS); }, died_of_sigbus, kDeathSays);
  (void)c;
}

}  // namespace
}  // namespace thetad::daemon
