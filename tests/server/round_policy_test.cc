// SynchronousPolicy (server/round_policy.h): a round waits for exactly the
// live workers, and a pull may ask for the round in progress only.
#include "server/round_policy.h"

#include "common/clock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

TEST(SynchronousPolicy, WaitsForExactlyTheLiveWorkers) {
  FakeClock clock;
  LeaseTable leases(3, absl::Seconds(1), &clock);
  SynchronousPolicy policy;
  const RoundPolicy& p = policy;
  for (uint32_t w = 0; w < 3; ++w) EXPECT_TRUE(p.WaitsFor(w, leases));
  clock.Advance(absl::Seconds(2));
  leases.Touch(1);
  leases.Expire([](uint32_t) { return false; });
  EXPECT_FALSE(p.WaitsFor(0, leases));
  EXPECT_TRUE(p.WaitsFor(1, leases));
  EXPECT_FALSE(p.WaitsFor(2, leases));
  // A worker rejoining mid-round is not waited for until it is live.
  leases.Rejoin(2, /*round_started=*/true);
  EXPECT_FALSE(p.WaitsFor(2, leases));
  leases.PromoteRejoined();
  EXPECT_TRUE(p.WaitsFor(2, leases));
}

TEST(SynchronousPolicy, PullsMayWaitForOneRoundOnly) {
  SynchronousPolicy policy;
  EXPECT_EQ(static_cast<const RoundPolicy&>(policy).max_pull_ahead(), 1u);
}

}  // namespace
}  // namespace pserver
