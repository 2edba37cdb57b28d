// server/round_diagnostics.h with scripted arrival orders and update norms:
// a straggler is found once when it has been last in most rounds of a
// window (and re-armed when it stops), balanced arrivals never are; an
// update blow-up right after the freeze or a phase change is found once.
#include "server/round_diagnostics.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1000000);

// One round of `workers` arrivals, 1 ms apart in the order given, then
// `extra` more for the last one; returns the round's findings.
RoundDiagnostics::RoundEnd Round(RoundDiagnostics& d, uint64_t step,
                                 const std::vector<uint32_t>& order,
                                 absl::Duration extra = absl::ZeroDuration(),
                                 double update = 1.0, bool change = false) {
  const absl::Time start = kT0 + absl::Seconds(step);
  absl::Time t = start;
  for (size_t i = 0; i < order.size(); ++i) {
    t += absl::Milliseconds(1);
    if (i + 1 == order.size()) t += extra;
    d.Arrived(order[i], t);
  }
  return d.EndRound(step, start, t + absl::Milliseconds(1), update, change);
}

TEST(RoundDiagnostics, MeasuresTheLastWorkerAndTheWaitForIt) {
  RoundDiagnostics d(3);
  RoundDiagnostics::RoundEnd r =
      Round(d, 0, {2, 0, 1}, absl::Milliseconds(9));
  EXPECT_EQ(r.last_worker, 1);
  EXPECT_NEAR(r.wait_seconds, 0.010, 1e-9);
  // Several chunks of one worker: its latest arrival counts.
  d.Arrived(0, kT0 + absl::Milliseconds(5));
  d.Arrived(1, kT0 + absl::Milliseconds(1));
  d.Arrived(1, kT0 + absl::Milliseconds(8));
  r = d.EndRound(1, kT0, kT0 + absl::Milliseconds(9), 1.0, false);
  EXPECT_EQ(r.last_worker, 1);
  EXPECT_NEAR(r.wait_seconds, 0.003, 1e-9);
  // One worker alone: nobody waited for anybody.
  d.Arrived(2, kT0);
  r = d.EndRound(2, kT0, kT0 + absl::Milliseconds(1), 1.0, false);
  EXPECT_EQ(r.last_worker, -1);
}

TEST(RoundDiagnostics, AStragglerIsFoundOnceAndAgainAfterItRecovered) {
  RoundDiagnostics d(4);
  std::vector<RoundFinding> found;
  uint64_t step = 0;
  auto run = [&](int rounds, bool slow3) {
    for (int i = 0; i < rounds; ++i, ++step) {
      // Worker 3 last (20 ms late) when slow; otherwise the order rotates.
      std::vector<uint32_t> order =
          slow3 ? std::vector<uint32_t>{0, 1, 2, 3}
                : std::vector<uint32_t>{static_cast<uint32_t>((step + 1) % 4),
                                        static_cast<uint32_t>((step + 2) % 4),
                                        static_cast<uint32_t>((step + 3) % 4),
                                        static_cast<uint32_t>(step % 4)};
      for (RoundFinding& f :
           Round(d, step, order,
                 slow3 ? absl::Milliseconds(20) : absl::ZeroDuration())
               .findings) {
        found.push_back(f);
      }
    }
  };
  run(300, false);
  EXPECT_TRUE(found.empty());  // each worker last in a quarter of rounds
  run(300, true);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, RoundFindingKind::kStraggler);
  EXPECT_THAT(found[0].message, HasSubstr("worker 3 pushed last in 60 of "
                                          "the last 100 rounds"));
  run(300, false);  // it recovers: share below 40% clears it
  run(300, true);
  ASSERT_EQ(found.size(), 2u);
}

TEST(RoundDiagnostics, ALastWorkerThatCostsNothingIsNoStraggler) {
  // Worker 1 is always last, but by 1 us in rounds of 1 s: not worth a word.
  RoundDiagnostics d(2);
  for (uint64_t step = 0; step < 300; ++step) {
    const absl::Time start = kT0 + absl::Seconds(step);
    d.Arrived(0, start + absl::Milliseconds(500));
    d.Arrived(1, start + absl::Milliseconds(500) + absl::Microseconds(1));
    EXPECT_TRUE(
        d.EndRound(step, start, start + absl::Seconds(1), 1.0, false)
            .findings.empty());
  }
}

TEST(RoundDiagnostics, UpdateBlowupAfterARegimeChangeIsFoundOnce) {
  // One worker: no waiting, so no straggler findings in the way.
  RoundDiagnostics d(1);
  uint64_t step = 0;
  for (; step < 100; ++step) {
    EXPECT_TRUE(Round(d, step, {0}, absl::ZeroDuration(), 0.01)
                    .findings.empty());
  }
  // A large update long after any change is not this diagnostic's business
  // (nothing changed): no finding.
  EXPECT_TRUE(Round(d, step++, {0}, absl::ZeroDuration(), 1.0)
                  .findings.empty());
  // The freeze: the next rounds' updates are 2.0, ~30x the average (which
  // that one large update raised to ~0.06).
  std::vector<RoundFinding> found;
  for (int i = 0; i < 50; ++i, ++step) {
    for (RoundFinding& f : Round(d, step, {0}, absl::ZeroDuration(),
                                 2.0 + 0.001 * i, /*change=*/i == 0)
                               .findings) {
      found.push_back(f);
    }
  }
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, RoundFindingKind::kUpdateBlowup);
  EXPECT_THAT(found[0].message, HasSubstr("the freeze or codec change"));
  // A gentle change (updates 2x) finds nothing.
  RoundDiagnostics calm(1);
  for (uint64_t t = 0; t < 300; ++t) {
    EXPECT_TRUE(Round(calm, t, {0}, absl::ZeroDuration(),
                      t < 100 ? 0.01 : 0.02, t == 100)
                    .findings.empty());
  }
}

}  // namespace
}  // namespace pserver
