// Timeline: a Chrome trace that parses as JSON (checked with Python when available), events
// from several threads, lane names, and the disabled mode writing nothing.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "common/errors.hpp"
#include "daemon/observe/timeline.hpp"
#include "tests/daemon/test_util.hpp"

namespace thetad::daemon {
namespace {

TEST(Timeline, WritesValidChromeTrace) {
  test::ScratchDir dir;
  const std::string path = dir.file("trace/rank1.json");
  {
    Timeline tl(path, 1);
    ASSERT_TRUE(tl.enabled());
    {
      Timeline::Scope s(&tl, Lane::compute, "forward", {{"step", int64_t{3}}});
    }
    const int64_t t0 = Timeline::now_us();
    tl.record(Lane::comm, "allreduce \"bucket\" 2\n", t0, 15,
              {{"bytes", int64_t{4096}}, {"group", std::string("task:2")}, {"gbps", 1.5}});
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&tl, t] {
        for (int i = 0; i < 500; ++i)
          tl.record(t % 2 ? Lane::cpu_adam : Lane::d2h, "op" + std::to_string(i), Timeline::now_us(), 1);
      });
    for (auto& th : threads) th.join();
    tl.close();
    tl.record(Lane::h2d, "after close", 0, 1);  // dropped, no crash
    tl.close();                                 // idempotent
  }
  const std::string text = test::read_file(path);
  EXPECT_NE(text.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(text.find("\"thread_name\""), std::string::npos);
  for (const char* lane : {"compute", "comm", "h2d", "d2h", "cpu_adam"})
    EXPECT_NE(text.find(std::string("\"name\":\"") + lane + "\""), std::string::npos) << lane;
  EXPECT_EQ(text.find("after close"), std::string::npos);
  if (!test::have_python()) GTEST_SKIP() << "/usr/bin/python3 not available to validate the JSON";
  EXPECT_TRUE(test::python_ok("import json,sys; json.load(open(sys.argv[1]))", path));
  EXPECT_TRUE(test::python_ok(
      "import json,sys\n"
      "ev=json.load(open(sys.argv[1]))[\"traceEvents\"]\n"
      "x=[e for e in ev if e[\"ph\"]==\"X\"]\n"
      "assert len(x)==2002, len(x)\n"
      "assert all(e[\"pid\"]==1 and e[\"dur\"]>=0 for e in x)\n"
      "f=[e for e in x if e[\"name\"]==\"forward\"][0]\n"
      "assert f[\"tid\"]==0 and f[\"args\"][\"step\"]==3\n"
      "c=[e for e in x if e[\"tid\"]==1][0]\n"
      "assert c[\"args\"]==dict(bytes=4096,group=\"task:2\",gbps=1.5), c",
      path));
}

TEST(Timeline, LargeTraceFlushesInChunks) {
  test::ScratchDir dir;
  const std::string path = dir.file("big.json");
  {
    Timeline tl(path, 0);
    for (int i = 0; i < 30000; ++i) tl.record(Lane::compute, "step", i, 1);
  }  // destructor closes
  if (!test::have_python()) GTEST_SKIP() << "/usr/bin/python3 not available to validate the JSON";
  EXPECT_TRUE(test::python_ok(
      "import json,sys; assert len(json.load(open(sys.argv[1]))[\"traceEvents\"]) == 30000 + 12", path));
}

TEST(Timeline, DisabledWritesNothing) {
  Timeline tl("", 0);
  EXPECT_FALSE(tl.enabled());
  tl.record(Lane::compute, "x", 0, 1);
  { Timeline::Scope s(&tl, Lane::comm, "y"); }
  { Timeline::Scope s(nullptr, Lane::comm, "z"); }
  tl.close();
}

TEST(Timeline, UnwritablePathIsConfigError) {
  test::ScratchDir dir;
  const std::string blocker = dir.file("f");
  { std::ofstream(blocker) << "x"; }
  EXPECT_THROW(Timeline(blocker + "/t.json", 0), ConfigError);
}

}  // namespace
}  // namespace thetad::daemon
