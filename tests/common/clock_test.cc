// Clock (common/clock.h): the fake clock moves only when told to, by
// exactly what it is told, from any thread; the real one follows absl::Now.
#include "common/clock.h"

#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

TEST(FakeClock, StandsStillUntilAdvanced) {
  const absl::Time start = absl::FromUnixSeconds(1000);
  FakeClock clock(start);
  EXPECT_EQ(clock.Now(), start);
  // However much real time passes, the fake clock does not move.
  const absl::Time real = absl::Now();
  while (absl::Now() - real < absl::Milliseconds(5)) {
  }
  EXPECT_EQ(clock.Now(), start);
  clock.Advance(absl::Milliseconds(250));
  EXPECT_EQ(clock.Now(), start + absl::Milliseconds(250));
  clock.Advance(absl::ZeroDuration());
  EXPECT_EQ(clock.Now(), start + absl::Milliseconds(250));
  clock.Advance(absl::Hours(3));
  EXPECT_EQ(clock.Now(), start + absl::Milliseconds(250) + absl::Hours(3));
}

TEST(FakeClock, DefaultStartIsAfterTheEpoch) {
  // A lease table's "last seen" of a fresh worker is Now(); starting past
  // the epoch keeps "now - last_seen" well defined for any timeout.
  FakeClock clock;
  EXPECT_GT(clock.Now(), absl::UnixEpoch());
}

TEST(FakeClock, UsableThroughTheInterface) {
  FakeClock fake(absl::FromUnixSeconds(50));
  const Clock& clock = fake;
  fake.Advance(absl::Seconds(7));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(57));
}

TEST(FakeClock, ConcurrentAdvancesAllCount) {
  FakeClock clock(absl::UnixEpoch());
  constexpr int kThreads = 4, kEach = 10000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&clock] {
      absl::Time last = clock.Now();
      for (int i = 0; i < kEach; ++i) {
        clock.Advance(absl::Microseconds(1));
        const absl::Time now = clock.Now();
        EXPECT_GT(now, last);  // only ever forward
        last = now;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(clock.Now(), absl::UnixEpoch() + absl::Microseconds(kThreads * kEach));
}

TEST(RealClock, FollowsAbslNowAndIsShared) {
  Clock* clock = Clock::Real();
  ASSERT_NE(clock, nullptr);
  EXPECT_EQ(clock, Clock::Real());
  const absl::Time before = absl::Now();
  const absl::Time now = clock->Now();
  const absl::Time after = absl::Now();
  EXPECT_LE(before, now);
  EXPECT_LE(now, after);
}

}  // namespace
}  // namespace pserver
