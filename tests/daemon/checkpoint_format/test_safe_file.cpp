// Output files safe from links and files planted by other users (common/safe_file.hpp): what
// thetad's metrics file, checkpoint lock and files, and exports are created with.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/safe_file.hpp"
#include "tests/daemon/test_util.hpp"

namespace thetad {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) { return test::read_file(path); }

// A victim file another user's link points at: never written through.
TEST(SafeFile, CreateFreshReplacesAPlantedLinkInsteadOfFollowingIt) {
  test::ScratchDir dir;
  std::ofstream(dir.file("victim")) << "secret";
  fs::create_symlink(dir.file("victim"), dir.file("out.part"));
  const int fd = safe_file::create_fresh(dir.file("out.part"));
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(::write(fd, "new", 3), 3);
  ::close(fd);
  EXPECT_EQ(slurp(dir.file("victim")), "secret");
  EXPECT_FALSE(fs::is_symlink(dir.file("out.part")));
  EXPECT_EQ(slurp(dir.file("out.part")), "new");
}

TEST(SafeFile, OpenOwnRefusesLinksAndOtherUsersFiles) {
  test::ScratchDir dir;
  std::ofstream(dir.file("victim")) << "secret";
  fs::create_symlink(dir.file("victim"), dir.file("metrics.jsonl"));
  std::string why;
  EXPECT_LT(safe_file::open_own(dir.file("metrics.jsonl"), O_WRONLY | O_TRUNC, 0644, &why), 0);
  EXPECT_NE(why.find("is a symbolic link"), std::string::npos) << why;
  EXPECT_EQ(slurp(dir.file("victim")), "secret");
  std::ofstream(dir.file("theirs")) << "theirs";
  if (::geteuid() == 0 && ::chown(dir.file("theirs").c_str(), 65534, 65534) == 0) {
    EXPECT_LT(safe_file::open_own(dir.file("theirs"), O_WRONLY | O_APPEND, 0644, &why), 0);
    EXPECT_NE(why.find("is owned by uid 65534"), std::string::npos) << why;
  }
  const int fd = safe_file::open_own(dir.file("mine"), O_WRONLY | O_APPEND, 0644, &why);
  EXPECT_GE(fd, 0) << why;
  ::close(fd);
}

TEST(SafeFile, MakeDirsIsPrivateAndChecksTheOwner) {
  test::ScratchDir dir;
  ASSERT_EQ(safe_file::make_dirs(dir.file("a/b/c"), true), "");
  struct stat st {};
  ASSERT_EQ(::stat(dir.file("a/b").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat(dir.file("a/b/c").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  std::ofstream(dir.file("file")) << "x";
  EXPECT_NE(safe_file::make_dirs(dir.file("file"), true).find("exists and is not a directory"), std::string::npos);
  if (::geteuid() == 0) {
    fs::create_directory(dir.file("theirs"));
    fs::create_symlink(dir.file("a"), dir.file("link"));
    if (::chown(dir.file("theirs").c_str(), 65534, 65534) == 0 && ::lchown(dir.file("link").c_str(), 65534, 65534) == 0) {
      EXPECT_NE(safe_file::make_dirs(dir.file("theirs"), true).find("is owned by uid 65534"), std::string::npos);
      EXPECT_EQ(safe_file::make_dirs(dir.file("theirs"), false), "");
      EXPECT_NE(safe_file::make_dirs(dir.file("link"), true).find("is a symbolic link of uid 65534"), std::string::npos);
    }
  }
}

TEST(SafeFile, ProbeWritableTriesWhereTheDirectoryWouldBeMade) {
  test::ScratchDir dir;
  EXPECT_EQ(safe_file::probe_writable(dir.file("not/yet/there")), "");
  EXPECT_FALSE(fs::exists(dir.file("not")));  // nothing made, nothing left
  EXPECT_TRUE(fs::is_empty(dir.file("")));
  std::ofstream(dir.file("file")) << "x";
  EXPECT_NE(safe_file::probe_writable(dir.file("file/sub")).find("is not a directory"), std::string::npos);
  std::string path;
  const int fd = safe_file::create_unique(dir.file(""), ".p-", ".tmp", &path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  EXPECT_EQ(path.rfind(dir.file(".p-"), 0), 0u);
  EXPECT_EQ(path.size(), dir.file(".p-").size() + 8 + 4);
}

}  // namespace
}  // namespace thetad
