// The launcher's log dir and files in places other users may write: no part of the path that
// another user controls is trusted, the dir is created 0700, and no file is written through a
// link, into a FIFO or into another user's file. Cases with another user's files need root
// (chown); they skip otherwise.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "common/errors.hpp"
#include "launch/private_dir.hpp"

namespace thetad::launch {
namespace {

constexpr uid_t kOther = 65534;  // nobody

class PrivateDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/thetad-private-dir.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    base_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + base_ + "'").c_str()); }

  // The ConfigError message of open_private_dir(path), "" when it is accepted.
  std::string refusal(const std::string& path, bool create = true) {
    try {
      open_private_dir(path, create, "log dir");
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }
  static bool root() { return ::geteuid() == 0; }
  static mode_t mode_of(const std::string& p) {
    struct stat st {};
    return ::lstat(p.c_str(), &st) == 0 ? st.st_mode : 0;
  }
  static bool exists(const std::string& p) { return mode_of(p) != 0; }
  static std::string text_of(const std::string& p) {
    std::string out;
    Fd fd(::open(p.c_str(), O_RDONLY));
    if (fd) read_fd(fd.get(), 1 << 20, out);
    return out;
  }
  static void write_text(const std::string& p, const std::string& text, mode_t mode = 0600) {
    Fd fd(::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, mode));
    ASSERT_TRUE(fd);
    ASSERT_TRUE(write_all(fd.get(), text));
  }

  std::string base_;
};

TEST_F(PrivateDir, MissingPartsAreCreated0700) {
  const std::string logs = base_ + "/runs/job/logs";
  ASSERT_EQ(refusal(logs), "");
  for (const std::string& p : {base_ + "/runs", base_ + "/runs/job", logs}) {
    EXPECT_TRUE(S_ISDIR(mode_of(p))) << p;
    EXPECT_EQ(mode_of(p) & 07777, 0700u) << p;
  }
  EXPECT_EQ(refusal(base_ + "/runs/./job/../job/logs/"), "");  // the same dir, written otherwise
  EXPECT_NE(refusal(base_ + "/absent", false), "");            // without create: refused
}

TEST_F(PrivateDir, ALinkAnotherUserOwnsIsNotFollowed) {
  if (!root()) GTEST_SKIP() << "needs root to make another user's link";
  ASSERT_EQ(::mkdir((base_ + "/victim").c_str(), 0700), 0);
  ASSERT_EQ(::symlink((base_ + "/victim").c_str(), (base_ + "/runs").c_str()), 0);
  EXPECT_EQ(refusal(base_ + "/runs/logs"), "");  // a link of this user's own: followed
  ASSERT_EQ(::rmdir((base_ + "/victim/logs").c_str()), 0);
  ASSERT_EQ(::lchown((base_ + "/runs").c_str(), kOther, kOther), 0);
  const std::string msg = refusal(base_ + "/runs/logs");
  EXPECT_NE(msg.find("'" + base_ + "/runs' is a symbolic link owned by uid 65534"), std::string::npos) << msg;
  EXPECT_FALSE(exists(base_ + "/victim/logs"));
  // The log dir itself as another user's link.
  ASSERT_EQ(::symlink((base_ + "/victim").c_str(), (base_ + "/logs").c_str()), 0);
  ASSERT_EQ(::lchown((base_ + "/logs").c_str(), kOther, kOther), 0);
  EXPECT_NE(refusal(base_ + "/logs"), "");
}

TEST_F(PrivateDir, ADirectoryEveryoneMayWriteWithoutStickyBitIsRefused) {
  ASSERT_EQ(::mkdir((base_ + "/shared").c_str(), 0777), 0);
  ASSERT_EQ(::chmod((base_ + "/shared").c_str(), 0777), 0);
  const std::string msg = refusal(base_ + "/shared/runs/logs");
  EXPECT_NE(msg.find("'" + base_ + "/shared' can be written by every user (mode 0777) and has no sticky bit"),
            std::string::npos)
      << msg;
  EXPECT_FALSE(exists(base_ + "/shared/runs"));  // nothing created in it
}

TEST_F(PrivateDir, InAStickySharedDirOnlyRootsOrYourOwnEntries) {
  ASSERT_EQ(::mkdir((base_ + "/tmp").c_str(), 0700), 0);
  ASSERT_EQ(::chmod((base_ + "/tmp").c_str(), 01777), 0);
  EXPECT_EQ(refusal(base_ + "/tmp/mine/logs"), "");  // like /tmp: created, this user's
  if (!root()) GTEST_SKIP() << "needs root to make another user's directory";
  ASSERT_EQ(::mkdir((base_ + "/tmp/runs").c_str(), 0755), 0);
  ASSERT_EQ(::chown((base_ + "/tmp/runs").c_str(), kOther, kOther), 0);
  const std::string msg = refusal(base_ + "/tmp/runs/logs");
  EXPECT_NE(msg.find("'" + base_ + "/tmp/runs' is owned by uid 65534 (not you or root) in a directory every user"),
            std::string::npos)
      << msg;
}

TEST_F(PrivateDir, TheDirItselfMustBeYoursAndClosedToOthers) {
  ASSERT_EQ(::mkdir((base_ + "/logs").c_str(), 0700), 0);
  ASSERT_EQ(::chmod((base_ + "/logs").c_str(), 01777), 0);
  EXPECT_NE(refusal(base_ + "/logs").find("can be written by every user (mode 1777)"), std::string::npos);
  ASSERT_EQ(::chmod((base_ + "/logs").c_str(), 0755), 0);
  EXPECT_EQ(refusal(base_ + "/logs"), "");  // an existing dir of this user's, 0755: kept as it is
  if (!root()) GTEST_SKIP() << "needs root to make another user's directory";
  ASSERT_EQ(::chown((base_ + "/logs").c_str(), kOther, kOther), 0);
  EXPECT_NE(refusal(base_ + "/logs").find("is owned by uid 65534, not by you"), std::string::npos);
  write_text(base_ + "/file", "x");
  EXPECT_NE(refusal(base_ + "/file/logs").find("is not a directory"), std::string::npos);
}

TEST_F(PrivateDir, FilesAreNeverWrittenThroughALinkOrIntoAFifo) {
  const Fd dir = open_private_dir(base_ + "/logs", true, "log dir");
  write_text(base_ + "/victim", "secret\n");
  ASSERT_EQ(::symlink((base_ + "/victim").c_str(), (base_ + "/logs/rank-0.log").c_str()), 0);
  std::string why;
  EXPECT_FALSE(open_append_at(dir.get(), "rank-0.log", why));
  EXPECT_EQ(why, "is a symbolic link");
  EXPECT_EQ(unsafe_entry(dir.get(), "rank-0.log"), "is a symbolic link");
  ASSERT_EQ(::mkfifo((base_ + "/logs/node-a.log").c_str(), 0600), 0);
  EXPECT_FALSE(open_append_at(dir.get(), "node-a.log", why));  // at once: no reader is waited for
  EXPECT_EQ(unsafe_entry(dir.get(), "node-a.log"), "is not a regular file");
  ASSERT_EQ(::link((base_ + "/victim").c_str(), (base_ + "/logs/launcher.log").c_str()), 0);
  EXPECT_FALSE(open_append_at(dir.get(), "launcher.log", why));
  EXPECT_EQ(why, "has other hard links");
  // A former predictable temporary name, and the file itself, as links: replaced, not followed.
  ASSERT_EQ(::symlink((base_ + "/victim").c_str(), (base_ + "/logs/rank-0.pid.tmp").c_str()), 0);
  ASSERT_EQ(::symlink((base_ + "/victim").c_str(), (base_ + "/logs/rank-0.pid").c_str()), 0);
  EXPECT_TRUE(replace_file_at(dir.get(), "rank-0.pid", "1 2 host node\n"));
  EXPECT_TRUE(S_ISREG(mode_of(base_ + "/logs/rank-0.pid")));
  EXPECT_EQ(mode_of(base_ + "/logs/rank-0.pid") & 0777, 0600u);
  EXPECT_EQ(text_of(base_ + "/logs/rank-0.pid"), "1 2 host node\n");
  std::string text;
  EXPECT_FALSE(read_file_at(dir.get(), "rank-0.log", text));  // a link: not read either
  EXPECT_EQ(text_of(base_ + "/victim"), "secret\n");
  EXPECT_EQ(mode_of(base_ + "/victim") & 0777, 0600u);
  // A file of this user's: appended, created 0600.
  Fd log = open_append_at(dir.get(), "rank-1.log", why);
  ASSERT_TRUE(log) << why;
  EXPECT_TRUE(write_all(log.get(), "line\n"));
  EXPECT_EQ(mode_of(base_ + "/logs/rank-1.log") & 0777, 0600u);
  if (!root()) return;
  write_text(base_ + "/logs/rank-2.log", "theirs\n");
  ASSERT_EQ(::chown((base_ + "/logs/rank-2.log").c_str(), kOther, kOther), 0);
  EXPECT_FALSE(open_append_at(dir.get(), "rank-2.log", why));
  EXPECT_EQ(why, "is owned by uid 65534, not by you");
}

TEST_F(PrivateDir, ReadsAreBounded) {
  const Fd dir = open_private_dir(base_ + "/logs", true, "log dir");
  write_text(base_ + "/logs/rank-0.exit", std::string(100000, '7'));
  std::string text;
  ASSERT_TRUE(read_file_at(dir.get(), "rank-0.exit", text, 1000));
  EXPECT_EQ(text.size(), 1000u);
}

}  // namespace
}  // namespace thetad::launch
