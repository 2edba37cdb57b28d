// RateLimitedLog on a fake clock: the first max_lines of an interval pass,
// the rest are counted and reported in one line when the next interval
// starts; nothing depends on the real time.
#include "common/rate_limited_log.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class RateLimitedLogTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  std::vector<std::string> lines_;
  RateLimitedLog log_{&clock_, 3, absl::Seconds(10),
                      [this](absl::string_view l) { lines_.emplace_back(l); }};
};

TEST_F(RateLimitedLogTest, WritesAtMostMaxLinesPerInterval) {
  for (int i = 0; i < 1000; ++i) log_.Log(absl::StrCat("bad request ", i));
  EXPECT_THAT(lines_,
              ElementsAre("bad request 0", "bad request 1", "bad request 2"));
  EXPECT_EQ(log_.suppressed_total(), 997);
}

TEST_F(RateLimitedLogTest, NextIntervalStartsWithTheSuppressedCount) {
  for (int i = 0; i < 10; ++i) log_.Log("a");
  clock_.Advance(absl::Seconds(9));
  log_.Log("still the first interval");
  EXPECT_EQ(lines_.size(), 3u);
  clock_.Advance(absl::Seconds(1));
  log_.Log("b");
  ASSERT_EQ(lines_.size(), 5u);
  EXPECT_THAT(lines_[3], StartsWith("8 similar lines suppressed in the last "
                                    "10s"));
  EXPECT_EQ(lines_[4], "b");
  EXPECT_EQ(log_.suppressed_total(), 8);
}

TEST_F(RateLimitedLogTest, QuietIntervalWritesNoSummary) {
  log_.Log("a");
  clock_.Advance(absl::Minutes(5));
  log_.Log("b");
  EXPECT_THAT(lines_, ElementsAre("a", "b"));
  EXPECT_EQ(log_.suppressed_total(), 0);
}

TEST_F(RateLimitedLogTest, IntervalsRestartFromTheFirstLineAfterOneEnds) {
  // 3 lines per interval however long the flood: lines = 3 per 10 s (plus
  // the summaries), whatever the request rate.
  for (int second = 0; second < 60; ++second) {
    for (int i = 0; i < 100; ++i) log_.Log("flood");
    clock_.Advance(absl::Seconds(1));
  }
  // 6 intervals: 3 lines each, and a summary before each but the first.
  EXPECT_EQ(lines_.size(), 6u * 3 + 5);
  EXPECT_EQ(log_.suppressed_total(), 6000 - 18);
  EXPECT_THAT(lines_[3], HasSubstr("997 similar lines suppressed"));
}

}  // namespace
}  // namespace pserver
