// Helpers shared by the daemon's torch-free tests: a scratch directory per test and a JSON check
// through Debian's python3 when it is installed.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errors.hpp"
#include "config/job.hpp"

namespace thetad::test {

// A job with the data section a Schedule reads: `schedule` (its YAML word) over `tasks` tasks,
// `batch` rows per rank, seed 1234, 100 steps.
inline config::Job schedule_job(const std::string& schedule, int64_t tasks, int64_t batch) {
  config::Job job;
  job.source = "test.yaml";
  job.seed = 1234;
  job.steps = 100;
  job.model.tasks = tasks;
  EXPECT_TRUE(config::from_string(schedule, job.data.schedule)) << schedule;
  job.data.batch_per_rank = batch;
  return job;
}

// A fresh directory under the system temp dir, removed at scope exit.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            (std::string("thetad_") + info->test_suite_name() + "_" + info->name() + "_" +
             std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// Expects `f` to throw ConfigError whose message names `file` and contains `what`.
template <typename F>
void expect_config_error(F&& f, const std::string& file, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no ConfigError; expected one about '" << what << "'";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

// Writes `bytes` to `path` (replaced).
inline void put(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Writes `bytes` over the start of the existing file `path` in place (no truncation, the same
// file), and sets its modification time a second on, as a later write's would be (two writes
// within one tick of the file system's clock may share one).
inline void write_in_place(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size())) << path;
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0) << path;
  const struct timespec times[2] = {st.st_atim, {st.st_mtim.tv_sec + 1, st.st_mtim.tv_nsec}};
  ASSERT_EQ(::futimens(fd, times), 0) << path;
  ::close(fd);
}

// A safetensors file of the given header text (padded to 8) followed by `data`.
inline std::string st_bytes(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

// The bytes numpy.save writes: magic, version, little-endian header length, the dict padded
// with spaces to a multiple of 64 bytes and ended by '\n', then the raw data.
inline std::string npy_bytes(const std::string& dict, const std::string& payload, int major = 1) {
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  const size_t n = header.size();
  out += static_cast<char>(n & 0xff);
  out += static_cast<char>((n >> 8) & 0xff);
  if (major != 1) {
    out += static_cast<char>((n >> 16) & 0xff);
    out += static_cast<char>((n >> 24) & 0xff);
  }
  return out + header + payload;
}

// The bytes of a vector's elements.
template <typename T>
std::string raw_bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

inline bool have_python() { return std::filesystem::exists("/usr/bin/python3"); }

// Runs a python3 snippet with `path` as argv[1]; true if it exits 0.
inline bool python_ok(const std::string& snippet, const std::string& path) {
  const std::string cmd = "/usr/bin/python3 -c '" + snippet + "' '" + path + "'";
  return std::system(cmd.c_str()) == 0;
}

}  // namespace thetad::test
