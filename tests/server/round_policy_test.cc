// The consistency rules of server/round_policy.h, alone: which workers a
// round waits for, the staleness bound, and the weights of stale pushes.
#include "server/round_policy.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace pserver {
namespace {

RoundPolicy Policy(Consistency mode, uint32_t s = 0, bool scaled = false) {
  ConsistencyConfig c;
  c.mode = mode;
  c.max_staleness = s;
  c.scale_by_staleness = scaled;
  return RoundPolicy(c);
}

WorkerView View(bool live, bool in_round, uint64_t version, bool fresh) {
  // fresh: not late.
  WorkerView v;
  v.live = live;
  v.in_round = in_round;
  v.version = version;
  v.late = !fresh;
  return v;
}

TEST(RoundPolicy, BspWaitsForExactlyTheLiveWorkers) {
  const RoundPolicy p = Policy(Consistency::kBsp);
  EXPECT_FALSE(p.relaxed());
  for (uint64_t version : {0u, 5u, 10u}) {
    for (bool fresh : {false, true}) {
      for (bool patience : {false, true}) {
        EXPECT_TRUE(p.WaitsFor(View(true, false, version, fresh), 10, patience));
        EXPECT_FALSE(
            p.WaitsFor(View(false, false, version, fresh), 10, patience));
      }
    }
  }
  EXPECT_EQ(p.max_staleness(), 0u);
  EXPECT_FALSE(p.has_patience());
  EXPECT_EQ(p.max_pull_ahead(), 1u);
}

TEST(RoundPolicy, SspWithBoundZeroWaitsAsBsp) {
  const RoundPolicy p = Policy(Consistency::kSsp, 0);
  EXPECT_TRUE(p.relaxed());
  EXPECT_FALSE(p.has_patience());
  // A worker that has not pushed into round k computes on version <= k.
  for (uint64_t version = 0; version <= 10; ++version) {
    for (bool fresh : {false, true}) {
      for (bool patience : {false, true}) {
        EXPECT_TRUE(p.WaitsFor(View(true, false, version, fresh), 10, patience))
            << version;
      }
    }
  }
  EXPECT_EQ(p.max_staleness(), 0u);
}

TEST(RoundPolicy, SspWaitsWhileAPushWouldExceedTheBound) {
  const RoundPolicy p = Policy(Consistency::kSsp, 2);
  ASSERT_TRUE(p.has_patience());
  // Round 10: a worker on version 8 (8 + 2 <= 10) must be waited for: its
  // push would otherwise land in round 11, 3 stale.
  EXPECT_TRUE(p.WaitsFor(View(true, false, 8, false), 10, true));
  EXPECT_TRUE(p.WaitsFor(View(true, false, 3, false), 10, true));
  // Version 9: its push may land in round 11 (2 stale), and it is not of
  // round 10's cohort (computing on an older version): not waited for.
  EXPECT_FALSE(p.WaitsFor(View(true, false, 9, false), 10, false));
  EXPECT_FALSE(p.WaitsFor(View(true, false, 9, true), 10, false));
  // The cohort (on version 10) is waited for while the patience lasts,
  // unless late.
  EXPECT_TRUE(p.WaitsFor(View(true, false, 10, true), 10, false));
  EXPECT_FALSE(p.WaitsFor(View(true, false, 10, true), 10, true));
  EXPECT_FALSE(p.WaitsFor(View(true, false, 10, false), 10, false));
  // Released (the round waited long enough): not even at the bound.
  EXPECT_FALSE(p.WaitsFor(View(true, false, 8, true), 10, false, true));
  EXPECT_FALSE(p.WaitsFor(View(true, false, 10, true), 10, false, true));
  // Dead workers never; a push already in the round always (all chunks).
  EXPECT_FALSE(p.WaitsFor(View(false, false, 3, true), 10, false));
  EXPECT_TRUE(p.WaitsFor(View(true, true, 10, false), 10, true));
  EXPECT_EQ(p.max_staleness(), 2u);
}

TEST(RoundPolicy, AsyncWaitsOnlyForPushesItHolds) {
  const RoundPolicy p = Policy(Consistency::kAsync);
  EXPECT_TRUE(p.relaxed());
  EXPECT_FALSE(p.has_patience());
  EXPECT_FALSE(p.WaitsFor(View(true, false, 0, true), 10, false));
  EXPECT_FALSE(p.WaitsFor(View(true, false, 10, true), 10, false));
  EXPECT_TRUE(p.WaitsFor(View(true, true, 0, false), 10, false));
  EXPECT_FALSE(p.WaitsFor(View(false, true, 0, false), 10, false));
  EXPECT_GT(p.max_staleness(), uint64_t{1} << 62);
}

TEST(RoundPolicy, StalePushesAreScaledOnlyWhenAsked) {
  const RoundPolicy plain = Policy(Consistency::kSsp, 4);
  const RoundPolicy scaled = Policy(Consistency::kSsp, 4, true);
  for (uint64_t s = 0; s < 8; ++s) EXPECT_EQ(plain.Weight(s), 1.0f);
  EXPECT_EQ(scaled.Weight(0), 1.0f);
  EXPECT_EQ(scaled.Weight(1), 1.0f);
  EXPECT_EQ(scaled.Weight(2), 0.5f);
  EXPECT_EQ(scaled.Weight(4), 0.25f);
}

TEST(ConsistencyConfig, ParsesAndValidatesNamingTheField) {
  EXPECT_EQ(*ParseConsistency("bsp"), Consistency::kBsp);
  EXPECT_EQ(*ParseConsistency("ssp"), Consistency::kSsp);
  EXPECT_EQ(*ParseConsistency("async"), Consistency::kAsync);
  absl::StatusOr<Consistency> bad = ParseConsistency("SSP");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("expected bsp, ssp or async"),
            std::string::npos);

  ConsistencyConfig c;
  EXPECT_TRUE(ValidateConsistencyConfig(c).ok());
  c.mode = Consistency::kSsp;
  c.max_staleness = kMaxStaleness + 1;
  absl::Status s = ValidateConsistencyConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_staleness is 1001; expected 0..1000"),
            std::string::npos)
      << s;
  c.max_staleness = 4;
  EXPECT_TRUE(ValidateConsistencyConfig(c).ok());
  EXPECT_EQ(DescribeConsistency(c), "ssp(s=4)");
  c.mode = Consistency::kAsync;
  s = ValidateConsistencyConfig(c);
  EXPECT_NE(s.message().find("applies to consistency ssp only"),
            std::string::npos)
      << s;
  c.max_staleness = 0;
  c.patience = -1;
  s = ValidateConsistencyConfig(c);
  EXPECT_NE(s.message().find("patience is -1"), std::string::npos) << s;
  c.patience = 0.5;
  c.scale_by_staleness = true;
  EXPECT_EQ(DescribeConsistency(c), "async,scaled");
}

}  // namespace
}  // namespace pserver
