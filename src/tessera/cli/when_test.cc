#include "tessera/cli/when.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <time.h>

namespace tessera::cli {
namespace {

class When : public ::testing::Test {
 protected:
  // A fixed zone, so that "midnight" is a known instant.
  void SetUp() override {
    const char* tz = getenv("TZ");
    old_ = tz ? tz : "";
    had_ = tz != nullptr;
    setenv("TZ", "UTC", 1);
    tzset();
  }
  void TearDown() override {
    if (had_)
      setenv("TZ", old_.c_str(), 1);
    else
      unsetenv("TZ");
    tzset();
  }
  std::string old_;
  bool had_ = false;
};

// 2026-11-25T20:17:30Z
constexpr double kNow = 1795637850;

TEST_F(When, WordsDurationsDatesAndEpochSeconds) {
  const double midnight = 1795564800;  // 2026-11-25T00:00:00Z
  ASSERT_EQ(ParseWhen("2026-11-25", kNow), midnight);
  EXPECT_EQ(ParseWhen("now", kNow), kNow);
  EXPECT_EQ(ParseWhen("today", kNow), midnight);
  EXPECT_EQ(ParseWhen("midnight", kNow), midnight);
  EXPECT_EQ(ParseWhen("yesterday", kNow), midnight - 86400);
  EXPECT_EQ(ParseWhen("noon", kNow), midnight + 12 * 3600);
  EXPECT_EQ(ParseWhen("90m", kNow), kNow - 5400);
  EXPECT_EQ(ParseWhen("7d", kNow), kNow - 7 * 86400);
  EXPECT_EQ(ParseWhen("2w", kNow), kNow - 14 * 86400);
  EXPECT_EQ(ParseWhen("now-7days", kNow), kNow - 7 * 86400);
  EXPECT_EQ(ParseWhen("now-2hours", kNow), kNow - 7200);
  EXPECT_EQ(ParseWhen("now-30minutes", kNow), kNow - 1800);
  EXPECT_EQ(ParseWhen("now-1week", kNow), kNow - 604800);
  EXPECT_EQ(ParseWhen("2026-11-25T08:00", kNow), midnight + 8 * 3600);
  EXPECT_EQ(ParseWhen("2026-11-25T08:00:30", kNow), midnight + 8 * 3600 + 30);
  EXPECT_EQ(ParseWhen("1795564800", kNow), midnight);
  for (const char* bad : {"", "tomorrowish", "now-", "now-x", "now-7", "7", "-7d", "7dd",
                          "2026-13-01", "2026-11-25T25:00", "yesterday-1", "d"}) {
    EXPECT_FALSE(ParseWhen(bad, kNow).has_value()) << bad;
  }
}

}  // namespace
}  // namespace tessera::cli
