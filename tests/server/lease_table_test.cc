// LeaseTable (server/lease_table.h) on a FakeClock: a live worker silent for
// more than the timeout is dropped unless the round already holds it (its
// lease is then renewed); a dropped worker rejoins at once between rounds,
// else from the next round; timeout 0 never drops anyone; slots beyond the
// initial workers start absent and join like a rejoin; Leave is at once.
#include "server/lease_table.h"

#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

bool Idle(uint32_t) { return false; }

std::vector<uint32_t> Dropped(LeaseTable& t,
                              absl::FunctionRef<bool(uint32_t)> busy = Idle) {
  std::vector<uint32_t> ids;
  for (const auto& [w, silent] : t.Expire(busy)) ids.push_back(w);
  return ids;
}

TEST(LeaseTable, EveryWorkerStartsLive) {
  FakeClock clock;
  LeaseTable t(4, 0, absl::Seconds(1), &clock);
  EXPECT_TRUE(t.enabled());
  EXPECT_EQ(t.timeout(), absl::Seconds(1));
  EXPECT_EQ(t.live_count(), 4u);
  for (uint32_t w = 0; w < 4; ++w) {
    EXPECT_TRUE(t.live(w));
    EXPECT_FALSE(t.rejoining(w));
  }
}

TEST(LeaseTable, DropsOnlyWorkersSilentForLongerThanTheTimeout) {
  FakeClock clock;
  LeaseTable t(3, 0, absl::Seconds(10), &clock);
  clock.Advance(absl::Seconds(6));
  t.Touch(1);
  clock.Advance(absl::Seconds(4));
  // Exactly the timeout is not "more than" it.
  EXPECT_TRUE(Dropped(t).empty());
  clock.Advance(absl::Milliseconds(1));
  auto dropped = t.Expire(Idle);
  ASSERT_EQ(dropped.size(), 2u);
  EXPECT_EQ(dropped[0].first, 0u);
  EXPECT_EQ(dropped[1].first, 2u);
  // How long each was silent, by the injected clock.
  EXPECT_EQ(dropped[0].second, absl::Seconds(10) + absl::Milliseconds(1));
  EXPECT_FALSE(t.live(0));
  EXPECT_TRUE(t.live(1));
  EXPECT_EQ(t.live_count(), 1u);
  // A dropped worker is not dropped twice.
  clock.Advance(absl::Hours(1));
  EXPECT_EQ(Dropped(t), std::vector<uint32_t>{1});
  EXPECT_EQ(t.live_count(), 0u);
}

TEST(LeaseTable, BusyWorkersAreKeptAndTheirLeasesRenewed) {
  FakeClock clock;
  LeaseTable t(2, 0, absl::Seconds(1), &clock);
  clock.Advance(absl::Seconds(5));
  // Worker 0 pushed (or waits in a pull): kept, its lease starts now.
  auto busy0 = [](uint32_t w) { return w == 0; };
  EXPECT_EQ(Dropped(t, busy0), std::vector<uint32_t>{1});
  clock.Advance(absl::Milliseconds(900));
  EXPECT_TRUE(Dropped(t).empty());  // renewed 0.9 s ago
  clock.Advance(absl::Milliseconds(200));
  EXPECT_EQ(Dropped(t), std::vector<uint32_t>{0});
}

TEST(LeaseTable, ZeroTimeoutNeverDrops) {
  FakeClock clock;
  LeaseTable t(2, 0, absl::ZeroDuration(), &clock);
  EXPECT_FALSE(t.enabled());
  clock.Advance(absl::Hours(24 * 365));
  EXPECT_TRUE(Dropped(t).empty());
  EXPECT_EQ(t.live_count(), 2u);
  LeaseTable negative(1, 0, -absl::Seconds(1), &clock);
  EXPECT_FALSE(negative.enabled());
  EXPECT_TRUE(Dropped(negative).empty());
}

TEST(LeaseTable, RenewAllRestartsEveryLease) {
  FakeClock clock;
  LeaseTable t(2, 0, absl::Seconds(1), &clock);
  clock.Advance(absl::Seconds(30));  // e.g. a slow model upload
  t.RenewAll();
  clock.Advance(absl::Milliseconds(999));
  EXPECT_TRUE(Dropped(t).empty());
}

TEST(LeaseTable, RejoinIsImmediateBetweenRoundsAndDeferredMidRound) {
  FakeClock clock;
  LeaseTable t(3, 0, absl::Seconds(1), &clock);
  clock.Advance(absl::Seconds(2));
  t.Touch(0);
  ASSERT_EQ(Dropped(t), (std::vector<uint32_t>{1, 2}));
  // A live worker's Rejoin changes nothing.
  EXPECT_TRUE(t.Rejoin(0, /*round_started=*/true));
  EXPECT_FALSE(t.rejoining(0));
  // Between rounds: live at once.
  EXPECT_TRUE(t.Rejoin(1, /*round_started=*/false));
  EXPECT_TRUE(t.live(1));
  EXPECT_FALSE(t.rejoining(1));
  // Mid-round: the round goes on without it; live from the next round.
  EXPECT_FALSE(t.Rejoin(2, /*round_started=*/true));
  EXPECT_FALSE(t.live(2));
  EXPECT_TRUE(t.rejoining(2));
  EXPECT_EQ(t.live_count(), 2u);
  clock.Advance(absl::Seconds(5));  // a long round
  t.Touch(0);
  t.Touch(1);
  EXPECT_TRUE(t.PromoteRejoined());
  EXPECT_TRUE(t.live(2));
  EXPECT_FALSE(t.rejoining(2));
  EXPECT_EQ(t.live_count(), 3u);
  // Promotion starts its lease: not dropped for the time it waited.
  EXPECT_TRUE(Dropped(t).empty());
  EXPECT_FALSE(t.PromoteRejoined());  // nobody left to promote
}

TEST(LeaseTable, SlotsBeyondTheInitialWorkersStartAbsentAndJoin) {
  FakeClock clock;
  LeaseTable t(4, 2, absl::Seconds(1), &clock);
  EXPECT_EQ(t.live_count(), 2u);
  EXPECT_TRUE(t.live(1));
  EXPECT_FALSE(t.live(2));
  EXPECT_TRUE(t.absent(2));
  // An absent slot is never expired (it holds no lease).
  clock.Advance(absl::Hours(1));
  EXPECT_EQ(Dropped(t), (std::vector<uint32_t>{0, 1}));
  // A joiner during a round is counted from the next one.
  EXPECT_FALSE(t.Rejoin(3, /*round_started=*/true));
  EXPECT_FALSE(t.absent(3));
  EXPECT_TRUE(t.rejoining(3));
  EXPECT_TRUE(t.PromoteRejoined());
  EXPECT_TRUE(t.live(3));
  EXPECT_TRUE(t.absent(2));
}

TEST(LeaseTable, LeaveIsAtOnceAndRegisterBringsTheWorkerBack) {
  FakeClock clock;
  LeaseTable t(3, 0, absl::Seconds(1), &clock);
  EXPECT_TRUE(t.Leave(1));
  EXPECT_FALSE(t.live(1));
  EXPECT_TRUE(t.left(1));
  EXPECT_EQ(t.live_count(), 2u);
  EXPECT_FALSE(t.Leave(1));  // idempotent: it was out already
  // A left worker is not dropped later.
  clock.Advance(absl::Hours(1));
  EXPECT_EQ(Dropped(t), (std::vector<uint32_t>{0, 2}));
  EXPECT_TRUE(t.Rejoin(1, /*round_started=*/false));
  EXPECT_TRUE(t.live(1));
  EXPECT_FALSE(t.left(1));
  // Leaving while about to rejoin cancels the rejoin.
  EXPECT_FALSE(t.Rejoin(0, /*round_started=*/true));
  EXPECT_TRUE(t.Leave(0));
  EXPECT_FALSE(t.PromoteRejoined());
  EXPECT_FALSE(t.live(0));
}

}  // namespace
}  // namespace pserver
