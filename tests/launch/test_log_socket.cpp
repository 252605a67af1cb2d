// The launcher's log socket: a file in a private directory (never the abstract namespace), a
// connection counts only with the launch's token and a rank of the launch, and each end refuses
// a peer of another uid. The cases with a second user run as root (a child that drops to
// uid 65534) and skip otherwise.
#include <gtest/gtest.h>

#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "launch/log_socket.hpp"

namespace thetad::launch {
namespace {

constexpr uid_t kOther = 65534;

struct stat stat_of(const std::string& p) {
  struct stat st {};
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st;
}

// Waits up to 2 s for `fd` to be readable.
bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 2000) == 1;
}

// The next connection of `l` (waiting up to 2 s), with the refusal it reported, if any.
LogListener::Peer next_peer(LogListener& l, std::string& refused) {
  readable(l.fd());
  return l.accept(refused);
}

// In a forked child: becomes uid 65534 with no groups, or exits 90.
void become_other_user() {
  if (::setgroups(0, nullptr) != 0 || ::setresgid(kOther, kOther, kOther) != 0 ||
      ::setresuid(kOther, kOther, kOther) != 0)
    ::_exit(90);
}

// Runs `body` in a child as uid 65534; its exit status (0: all it checked held).
template <typename F>
int as_other_user(F body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    become_other_user();
    ::_exit(body());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 99;
}

// A raw connection to `path` (-1 on failure, errno kept).
int raw_connect(const std::string& path) {
  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    ::close(s);
    errno = err;
    return -1;
  }
  return s;
}

TEST(LogSocket, AFileInAPrivateDirectoryNotAnAbstractName) {
  std::string dir, path;
  {
    LogListener l;
    ASSERT_TRUE(l.valid()) << l.why();
    dir = l.dir();
    path = l.path();
    ASSERT_EQ(path.rfind(dir + "/", 0), 0u);
    ASSERT_EQ(path[0], '/');
    const struct stat d = stat_of(dir);
    EXPECT_TRUE(S_ISDIR(d.st_mode));
    EXPECT_EQ(d.st_mode & 07777, 0700u);
    EXPECT_EQ(d.st_uid, ::geteuid());
    const struct stat s = stat_of(path);
    EXPECT_TRUE(S_ISSOCK(s.st_mode));
    EXPECT_EQ(s.st_mode & 0777, 0600u);
    EXPECT_EQ(l.token().size(), 64u);
    LogListener other;
    EXPECT_NE(other.token(), l.token());  // random per launch
  }
  struct stat st {};
  EXPECT_NE(::lstat(dir.c_str(), &st), 0) << "the directory outlived the listener";
}

TEST(LogSocket, AWrapperWithTheTokenProvesItsRank) {
  LogListener l;
  ASSERT_TRUE(l.valid()) << l.why();
  std::string why, refused;
  Fd c = connect_log_socket(l.path(), l.token(), 3, why);
  ASSERT_TRUE(c) << why;
  LogListener::Peer p = next_peer(l, refused);
  ASSERT_TRUE(p.fd);
  EXPECT_EQ(p.uid, ::geteuid());
  EXPECT_EQ(p.pid, ::getpid());
  ASSERT_TRUE(readable(p.fd.get()));
  char buf[256];
  const ssize_t n = ::read(p.fd.get(), buf, sizeof buf);
  ASSERT_GT(n, 0);
  const std::string line(buf, size_t(n));
  EXPECT_EQ(line, hello_line(l.token(), 3));
  EXPECT_EQ(check_hello(line.substr(0, line.size() - 1), l.token(), 4, why), 3);
}

TEST(LogSocket, AConnectionWithoutTheTokenOrARankOfTheLaunchIsRefused) {
  const std::string token(64, 'a');
  std::string why;
  EXPECT_EQ(check_hello(token + " 0", token, 2, why), 0);
  EXPECT_EQ(check_hello(token + " 1", token, 2, why), 1);
  for (const std::string& bad : {std::string("[rank 1] error: forged"), std::string(""), std::string(63, 'a') + " 1",
                                 std::string(64, 'b') + " 1", token, token + "a 1", std::string("1")}) {
    SCOPED_TRACE(bad);
    why.clear();
    EXPECT_EQ(check_hello(bad, token, 2, why), -1);
    EXPECT_EQ(why, "without the launch's token");
  }
  for (const std::string& bad : {token + " 2", token + " -1", token + " 01", token + " x", token + " "}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(check_hello(bad, token, 2, why), -1);
    EXPECT_EQ(why, "naming no rank of this launch");
  }
}

TEST(LogSocket, AnotherUserCannotReachItAndIsRefusedWhereItCould) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as a second user";
  LogListener l;
  ASSERT_TRUE(l.valid()) << l.why();
  const std::string path = l.path();
  // The private directory keeps the other user out.
  EXPECT_EQ(as_other_user([&] { return raw_connect(path) < 0 && errno == EACCES ? 0 : 1; }), 0);
  // With the directory and socket opened to all (a mistake), the uid check still refuses it.
  ASSERT_EQ(::chmod(l.dir().c_str(), 0755), 0);
  ASSERT_EQ(::chmod(path.c_str(), 0666), 0);
  EXPECT_EQ(as_other_user([&] {
              const int s = raw_connect(path);
              const std::string forged = "[rank 1] error: forged\n";
              return s >= 0 && ::write(s, forged.data(), forged.size()) > 0 ? 0 : 1;
            }),
            0);
  std::string refused;
  LogListener::Peer p = next_peer(l, refused);
  EXPECT_FALSE(p.fd);
  EXPECT_NE(refused.find("refused a log connection from uid 65534"), std::string::npos) << refused;
}

// A wrapper whose socket path leads to another user's listener (a name taken first) sends it
// nothing: neither the token nor a line.
TEST(LogSocket, AWrapperRefusesAListenerOfAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as a second user";
  char tmpl[] = "/tmp/thetad-other-listener.XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, path = dir + "/log.sock";
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {  // the other user's listener: exits 0 when it received nothing
    become_other_user();
    const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    ::umask(0);
    if (::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(s, 4) != 0) ::_exit(91);
    (void)!::write(ready[1], "r", 1);
    const int c = ::accept(s, nullptr, nullptr);
    if (c < 0) ::_exit(92);
    char buf[256];
    pollfd p{c, POLLIN, 0};
    if (::poll(&p, 1, 5000) != 1) ::_exit(93);
    ::_exit(::read(c, buf, sizeof buf) == 0 ? 0 : 1);  // 0: closed unread, nothing sent
  }
  char r;
  ASSERT_EQ(::read(ready[0], &r, 1), 1);
  std::string why;
  Fd c = connect_log_socket(path, std::string(64, 't'), 0, why);
  EXPECT_FALSE(c);
  EXPECT_NE(why.find("is served by uid 65534"), std::string::npos) << why;
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the other user's listener received bytes";
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
  ::close(ready[0]);
  ::close(ready[1]);
}

}  // namespace
}  // namespace thetad::launch
