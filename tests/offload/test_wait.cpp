// The store's one polling wait (offload/util.hpp): returns once the condition holds, ends with
// the poll's error, and times out naming what it waited for.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>

#include "common/errors.hpp"
#include "offload/util.hpp"

using thetad::offload::wait_until;

TEST(WaitUntil, ReturnsOnceTheConditionHolds) {
  std::atomic<bool> flag{false};
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    flag = true;
  });
  EXPECT_NO_THROW(wait_until([&] { return flag.load(); }, 10.0, [] { return std::string("flag"); }));
  t.join();
}

TEST(WaitUntil, TimesOutNamingWhatItWaitedFor) {
  try {
    wait_until([] { return false; }, 0.05, [] { return std::string("group 3 to reach update 2"); });
    ADD_FAILURE() << "no TimeoutError";
  } catch (const thetad::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("for group 3 to reach update 2"), std::string::npos) << e.what();
  }
}

TEST(WaitUntil, ThePollsErrorEndsTheWait) {
  EXPECT_THROW(wait_until([] { return false; }, 10.0, [] { return std::string("x"); },
                          [] { throw std::runtime_error("worker failed"); }),
               std::runtime_error);
}

TEST(TimeoutOf, SecondsToTheControlPlanesTimeout) {
  EXPECT_EQ(thetad::offload::timeout_of(2.5).count(), 2500);
  EXPECT_GT(thetad::offload::timeout_of(0).count(), 1000LL * 3600 * 24);  // none: a year
}
