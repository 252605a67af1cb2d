// read_regular_file, link_outside, parse_json, json_brief and printable: the helpers every reader
// of others' files goes through (job files, config.json, adapter_config.json, safetensors
// headers and indexes, state dicts).
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/file_read.hpp"
#include "common/json_read.hpp"
#include "common/text.hpp"

namespace thetad {
namespace {

namespace fs = std::filesystem;

class Input : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("thetad_input_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string put(const std::string& name, const std::string& text) const {
    std::ofstream((dir_ / name).string(), std::ios::binary) << text;
    return (dir_ / name).string();
  }
  fs::path dir_;
};

TEST_F(Input, ReadsRegularFilesWithinTheBound) {
  const std::string path = put("a.txt", std::string(5000, 'x'));
  std::string text;
  EXPECT_TRUE(read_regular_file(path, 5000, text));
  EXPECT_EQ(text, std::string(5000, 'x'));
  const ReadResult big = read_regular_file(path, 4999, text);
  EXPECT_EQ(big.failure, ReadFailure::too_large);
  EXPECT_EQ(big.why, "larger than 4999 bytes");
  FileBytes bytes;
  EXPECT_TRUE(read_regular_file(put("empty", ""), 10, bytes));
  EXPECT_EQ(bytes.size(), 0u);
}

TEST_F(Input, RefusesWhatIsNotARegularFile) {
  std::string text;
  ReadResult r = read_regular_file(dir_.string(), 100, text);
  EXPECT_EQ(r.failure, ReadFailure::not_regular);
  EXPECT_EQ(r.why, "it is a directory");
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  r = read_regular_file(fifo, 100, text);  // refused before the open: no hang
  EXPECT_EQ(r.why, "not a regular file (a FIFO)");
  r = read_regular_file("/dev/zero", 100, text);
  EXPECT_EQ(r.why, "not a regular file (a character device)");
  r = read_regular_file((dir_ / "missing").string(), 100, text);
  EXPECT_EQ(r.failure, ReadFailure::io);
  EXPECT_EQ(r.why, "No such file or directory");
}

TEST_F(Input, LinksStayWithinTheDirectory) {
  put("real", "x");
  fs::create_symlink("real", dir_ / "inside");
  fs::create_symlink("/etc/passwd", dir_ / "outside");
  fs::create_symlink("../" + dir_.filename().string() + "/real", dir_ / "roundabout");
  fs::create_symlink("nowhere", dir_ / "dangling");
  const std::string d = dir_.string();
  EXPECT_EQ(link_outside(d, "real"), "");
  EXPECT_EQ(link_outside(d, "inside"), "");
  EXPECT_EQ(link_outside(d, "roundabout"), "");
  EXPECT_EQ(link_outside(d, "missing"), "");
  EXPECT_EQ(link_outside(d, "outside").rfind("a symbolic link to /etc/passwd, outside " + d, 0), 0u)
      << link_outside(d, "outside");
  EXPECT_EQ(link_outside(d, "dangling"), "a symbolic link that cannot be resolved: No such file or directory");
  // A Hugging Face cache snapshot links into its repository's blobs/, and nowhere else.
  const fs::path repo = dir_ / "models--org--m", snap = repo / "snapshots" / "rev";
  fs::create_directories(snap);
  fs::create_directories(repo / "blobs");
  fs::create_directories(repo / "refs");
  std::ofstream(repo / "blobs" / "h1") << "x";
  std::ofstream(repo / "refs" / "main") << "rev";
  fs::create_symlink("../../blobs/h1", snap / "model.safetensors");
  fs::create_symlink("../../refs/main", snap / "config.json");
  EXPECT_EQ(link_outside(snap.string(), "model.safetensors"), "");
  EXPECT_NE(link_outside(snap.string(), "config.json"), "");
  // A directory named blobs/ next to a folder that is not a snapshot: outside.
  fs::create_directories(dir_ / "x" / "notsnap" / "rev");
  fs::create_directories(dir_ / "x" / "blobs");
  std::ofstream(dir_ / "x" / "blobs" / "h") << "x";
  fs::create_symlink("../../blobs/h", dir_ / "x" / "notsnap" / "rev" / "f");
  EXPECT_NE(link_outside((dir_ / "x" / "notsnap" / "rev").string(), "f"), "");
}

TEST(Json, NestingIsBounded) {
  JsonProblem p;
  std::string ok = std::string(64, '[') + std::string(64, ']'), deep = std::string(65, '[') + std::string(65, ']');
  EXPECT_FALSE(parse_json(ok.data(), ok.data() + ok.size(), p).is_discarded());
  EXPECT_EQ(p, JsonProblem::none);
  EXPECT_TRUE(parse_json(deep.data(), deep.data() + deep.size(), p).is_discarded());
  EXPECT_EQ(p, JsonProblem::too_deep);
  EXPECT_EQ(json_problem_text(p), "nested deeper than 64 levels");
  // Two hundred thousand levels deep, inside an object: refused without recursion.
  const std::string huge = "{\"a\": " + std::string(200000, '[') + std::string(200000, ']') + "}";
  EXPECT_TRUE(parse_json(huge.data(), huge.data() + huge.size(), p).is_discarded());
  EXPECT_EQ(p, JsonProblem::too_deep);
  const std::string bad = "{\"a\": ";
  parse_json(bad.data(), bad.data() + bad.size(), p);
  EXPECT_EQ(p, JsonProblem::invalid);
}

TEST(Json, BriefQuotesScalarsAndKinds) {
  using nlohmann::json;
  EXPECT_EQ(json_brief(json(18446744073709551615ull)), "18446744073709551615");
  EXPECT_EQ(json_brief(json(-2)), "-2");
  EXPECT_EQ(json_brief(json(nullptr)), "null");
  EXPECT_EQ(json_brief(json("a\x1b[2Jb")), "\"a\\x1b[2Jb\"");
  EXPECT_EQ(json_brief(json(std::string(50, 'z'))), "\"" + std::string(40, 'z') + "...\"");
  EXPECT_EQ(json_brief(json::array({1, 2, 3})), "an array of 3 items");
  EXPECT_EQ(json_brief(json::object({{"k", 1}})), "an object of 1 key");
}

TEST(Text, PrintableEscapesEveryControl) {
  EXPECT_EQ(printable("a\x1b[31mb\x7f"), "a\\x1b[31mb\\x7f");
  EXPECT_EQ(printable("\xc2\x9b" "31m"), "\\xc2\\x9b31m");  // C1 CSI
  EXPECT_EQ(printable("caf\xc3\xa9 \xc2\xa0"), "caf\xc3\xa9 \xc2\xa0");  // other UTF-8 passes
  EXPECT_EQ(printable("\xff"), "\\xff");
}

}  // namespace
}  // namespace thetad
