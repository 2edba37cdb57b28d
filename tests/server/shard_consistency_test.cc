// The shard under --consistency=ssp and async (server/round_policy.h), on
// scripted arrival orders with a FakeClock: ssp with s = 0 is bsp bit for
// bit, rounds stop waiting for stragglers within the bound (and only
// then), stale pushes land in later rounds with their staleness, pulls
// read their own writes and get the newest weights, leases and restarts
// keep working, and the hostile cases of the suite are refused or
// acknowledged without changing state in every mode.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/rejection.h"
#include "gtest/gtest.h"
#include "server/shard.h"
#include "tests/server/server_test_util.h"
#include "tests/test_util/temp_dir.h"

namespace pserver {
namespace {

using testing_util::ExactSgdConfig;
using testing_util::Fp32Tensor;
using testing_util::Gradient;
using testing_util::InitialWeights;
using testing_util::kSmallElements;
using testing_util::OneBitAdamConfig;
using testing_util::PullRequestFor;
using testing_util::PushRequestFor;
using testing_util::RegisterRequestFor;

constexpr absl::Duration kWait = absl::Seconds(5);

ConsistencyConfig Ssp(uint32_t s, bool scaled = false) {
  ConsistencyConfig c;
  c.mode = Consistency::kSsp;
  c.max_staleness = s;
  c.scale_by_staleness = scaled;
  c.patience = 0.5;  // the scripted arrival times below assume it
  return c;
}

ConsistencyConfig Async(bool scaled = false) {
  ConsistencyConfig c;
  c.mode = Consistency::kAsync;
  c.scale_by_staleness = scaled;
  return c;
}

struct Fixture {
  FakeClock clock;
  std::unique_ptr<Shard> shard;
  uint64_t n;

  // A model of `n` elements in one tensor (kSmallElements: the suite's
  // small layout).
  explicit Fixture(ShardConfig config, uint64_t elements = kSmallElements)
      : n(elements) {
    ShardEnv env;
    env.clock = &clock;
    auto s = Shard::Create(config, env);
    EXPECT_TRUE(s.ok()) << s.status();
    shard = *std::move(s);
    const std::vector<float> x0 = InitialWeights(n);
    for (uint32_t w = 0; w < config.num_workers; ++w) {
      v1::RegisterRequest r = RegisterRequestFor(w, config.num_workers, x0);
      if (n != kSmallElements) {
        r.mutable_layout()->Clear();
        v1::TensorSpec* t = r.mutable_layout()->add_tensors();
        t->set_name("w");
        t->add_shape(n);
      }
      auto resp = shard->Register(r);
      EXPECT_TRUE(resp.ok()) << resp.status();
    }
  }

  absl::StatusOr<v1::PushResponse> Push(uint32_t w, uint64_t tag,
                                        uint64_t seed_step) {
    return shard->Push(
        PushRequestFor(w, tag, Fp32Tensor(Gradient(n, w, seed_step))));
  }
  uint64_t Step() { return shard->Status().current_step(); }
  // A pull of `step` answered now (or an error); nullopt if it waits.
  std::optional<absl::StatusOr<v1::PullResponse>> PullNow(uint32_t w,
                                                           uint64_t step) {
    auto r = shard->PullBlocking(PullRequestFor(w, step, -1, 0, true),
                                 absl::Milliseconds(50));
    if (!r.ok() && absl::IsDeadlineExceeded(r.status())) return std::nullopt;
    return r;
  }
  // The current weights, every chunk (fp32 pulls).
  std::vector<float> Weights() {
    std::vector<float> x;
    for (uint32_t c = 0; x.size() < n; ++c) {
      v1::PullRequest q = PullRequestFor(0, Step(), -1, 0, true);
      q.set_chunk(c);
      auto r = shard->PullBlocking(q, kWait);
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) return {};
      std::vector<float> part = testing_util::DecodeAll(r->weights());
      if (part.empty()) return {};
      x.insert(x.end(), part.begin(), part.end());
    }
    return x;
  }
};

// One full run pushed in the same scripted (shuffled) order into two
// shards: every pull answer's bytes and checksum must agree, round by round.
void RunScripted(ShardConfig a_config, ShardConfig b_config, uint32_t workers,
                 uint64_t rounds, uint64_t seed) {
  Fixture a(a_config), b(b_config);
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> checksum(2, 0);
  for (uint64_t t = 0; t < rounds; ++t) {
    // Every worker arrives a second after the round opened.
    a.clock.Advance(absl::Seconds(1));
    b.clock.Advance(absl::Seconds(1));
    std::vector<uint32_t> order(workers);
    for (uint32_t w = 0; w < workers; ++w) order[w] = w;
    std::shuffle(order.begin(), order.end(), rng);
    for (uint32_t w : order) {
      ASSERT_TRUE(a.Push(w, t, t).ok());
      ASSERT_TRUE(b.Push(w, t, t).ok());
    }
    ASSERT_EQ(a.Step(), t + 1);
    ASSERT_EQ(b.Step(), t + 1);
    for (uint32_t w = 0; w < workers; ++w) {
      auto pa = a.shard->PullBlocking(
          PullRequestFor(w, t + 1, static_cast<int64_t>(t), checksum[0]),
          kWait);
      auto pb = b.shard->PullBlocking(
          PullRequestFor(w, t + 1, static_cast<int64_t>(t), checksum[1]),
          kWait);
      ASSERT_TRUE(pa.ok() && pb.ok());
      ASSERT_EQ(pa->step(), pb->step());
      ASSERT_EQ(pa->kind(), pb->kind()) << "round " << t;
      ASSERT_EQ(pa->weights().payload(), pb->weights().payload())
          << "round " << t;
      ASSERT_EQ(pa->replica_checksum(), pb->replica_checksum());
      if (w + 1 == workers) {
        checksum[0] = pa->replica_checksum();
        checksum[1] = pb->replica_checksum();
      }
    }
  }
  EXPECT_EQ(a.Weights(), b.Weights());
  EXPECT_EQ(a.shard->Status().stage(), b.shard->Status().stage());
}

TEST(ShardConsistency, SspWithBoundZeroIsBspBitForBitOverAFullRun) {
  // 1-bit Adam crossing its freeze, 1-bit pulls, 4 workers arriving in a
  // different order every round.
  ShardConfig bsp = OneBitAdamConfig(4, /*freeze_step=*/20);
  bsp.optimizer.preconditioned = false;  // raw pushes in both stages
  ShardConfig ssp = bsp;
  ssp.consistency = Ssp(0);
  RunScripted(bsp, ssp, 4, 60, /*seed=*/7);
}

TEST(ShardConsistency, SspThatNeverFallsBehindMatchesBsp) {
  // s = 4, but every worker pushes every round before the patience ends:
  // the rounds are bsp's.
  ShardConfig bsp = OneBitAdamConfig(3, /*freeze_step=*/10);
  bsp.optimizer.preconditioned = false;
  ShardConfig ssp = bsp;
  ssp.consistency = Ssp(4);
  RunScripted(bsp, ssp, 3, 30, /*seed=*/11);
}

TEST(ShardConsistency, SspStopsWaitingForAStragglerAfterThePatience) {
  ShardConfig c = ExactSgdConfig(3);
  c.consistency = Ssp(2);
  Fixture f(c);
  // Round 0 opens at t0; workers 0 and 1 arrive after 1 s, worker 2 not.
  f.clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(f.Push(0, 0, 0).ok());
  ASSERT_TRUE(f.Push(1, 0, 0).ok());
  EXPECT_EQ(f.Step(), 0u);  // worker 2 is fresh: waited for
  f.clock.Advance(absl::Milliseconds(400));  // 1.4 s < 1.5 x median
  f.shard->CheckPatience();
  EXPECT_EQ(f.Step(), 0u);
  EXPECT_FALSE(f.PullNow(0, 1).has_value());
  f.clock.Advance(absl::Milliseconds(200));  // 1.6 s: patience over
  f.shard->CheckPatience();
  EXPECT_EQ(f.Step(), 1u);
  auto p0 = f.PullNow(0, 1);
  ASSERT_TRUE(p0.has_value() && p0->ok());
  EXPECT_EQ((*p0)->step(), 1u);

  // Worker 2's push of step 0 lands in round 1, one step stale. Its pull
  // of step 1 waits for that round (its own push applied) and then gets
  // step 2, newer than asked.
  auto late = f.Push(2, 0, 0);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_FALSE(late->duplicate());
  EXPECT_FALSE(f.PullNow(2, 1).has_value());
  // Worker 2 is not fresh any more; with s = 2 round 1 need not wait for
  // its next push, only for workers 0 and 1.
  f.clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(f.Push(0, 1, 1).ok());
  ASSERT_TRUE(f.Push(1, 1, 1).ok());
  EXPECT_EQ(f.Step(), 2u);
  auto p2 = f.PullNow(2, 1);
  ASSERT_TRUE(p2.has_value() && p2->ok());
  EXPECT_EQ((*p2)->step(), 2u);

  // Round 1 applied the mean of three pushes: worker 2's stale one too.
  // x2 = x0 - mean(g0(0), g1(0)) - mean(g0(1), g1(1), g2(0)).
  std::vector<float> x = InitialWeights(kSmallElements);
  auto g = [](uint32_t w, uint64_t t) { return Gradient(kSmallElements, w, t); };
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] -= (g(0, 0)[i] + g(1, 0)[i]) / 2.0f;
  }
  const std::vector<float> a = g(0, 1), b = g(1, 1), s = g(2, 0);
  for (size_t i = 0; i < x.size(); ++i) x[i] -= ((a[i] + b[i]) + s[i]) / 3.0f;
  std::vector<float> got = f.Weights();
  ASSERT_EQ(got.size(), x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(got[i], x[i], 1e-6) << i;
}

TEST(ShardConsistency, SspWaitsForAStragglerAtTheBound) {
  ShardConfig c = ExactSgdConfig(2);
  c.consistency = Ssp(1);
  Fixture f(c);
  // Round 0 passes worker 1 over (patience), so worker 1 computes on
  // version 0 while round 1 runs: 0 + 1 <= 1, round 1 must wait for it.
  f.clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(f.Push(0, 0, 0).ok());
  f.clock.Advance(absl::Seconds(1));
  f.shard->CheckPatience();
  ASSERT_EQ(f.Step(), 1u);
  ASSERT_TRUE(f.Push(0, 1, 1).ok());
  f.clock.Advance(absl::Seconds(10));
  f.shard->CheckPatience();
  EXPECT_EQ(f.Step(), 1u) << "round 1 went on past the staleness bound";
  EXPECT_FALSE(f.PullNow(0, 2).has_value());
  ASSERT_TRUE(f.Push(1, 0, 0).ok());  // 1 stale: within the bound
  EXPECT_EQ(f.Step(), 2u);
  auto p = f.PullNow(0, 2);
  ASSERT_TRUE(p.has_value() && p->ok());
}

TEST(ShardConsistency, ARoundWaitsAtTheBoundOnlyForAWhile) {
  // A worker at the bound may itself be waiting on another shard; so the
  // round waits for it kLaggardWaitRounds round durations, then goes on,
  // and the push that comes too stale after that is dropped.
  ShardConfig c = ExactSgdConfig(2);
  c.consistency = Ssp(1);
  Fixture f(c);
  f.clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(f.Push(0, 0, 0).ok());
  f.clock.Advance(absl::Seconds(1));
  f.shard->CheckPatience();
  ASSERT_EQ(f.Step(), 1u);  // round 0 took 2 s: the wait is 20 s
  ASSERT_TRUE(f.Push(0, 1, 1).ok());
  f.clock.Advance(absl::Seconds(19));
  f.shard->CheckPatience();
  EXPECT_EQ(f.Step(), 1u);
  f.clock.Advance(absl::Seconds(2));
  f.shard->CheckPatience();
  EXPECT_EQ(f.Step(), 2u);
  const std::vector<float> before = f.Weights();
  auto late = f.Push(1, 0, 0);  // 2 stale > 1
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_TRUE(late->round_lost());
  EXPECT_EQ(f.Weights(), before);
  EXPECT_EQ(f.Step(), 2u);
}

TEST(ShardConsistency, TheWaitAtTheBoundFollowsTheRecentRoundsNotTheFirst) {
  // The first round includes the workers' start (10 s here); the wait at
  // the bound is kLaggardWaitRounds times the median of the newest rounds,
  // so a few normal rounds later it no longer counts. (A moving average
  // would still hold most of it: 76 s here.)
  ShardConfig c = ExactSgdConfig(2);
  c.consistency = Ssp(1);
  Fixture f(c);
  f.clock.Advance(absl::Seconds(10));
  ASSERT_TRUE(f.Push(0, 0, 0).ok());
  ASSERT_TRUE(f.Push(1, 0, 0).ok());
  for (uint64_t t = 1; t <= 2; ++t) {  // two rounds of 1 s
    f.clock.Advance(absl::Seconds(1));
    ASSERT_TRUE(f.Push(0, t, t).ok());
    ASSERT_TRUE(f.Push(1, t, t).ok());
  }
  ASSERT_EQ(f.Step(), 3u);
  // Round 3: worker 1 misses its patience (1.5 s), the round takes 2 s.
  f.clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(f.Push(0, 3, 3).ok());
  f.clock.Advance(absl::Seconds(1));
  f.shard->CheckPatience();
  ASSERT_EQ(f.Step(), 4u);
  // Round 4 waits for worker 1 at the bound: 10 x the median of
  // {10, 1, 1, 2} s (2 s), not 10 x the first round.
  ASSERT_TRUE(f.Push(0, 4, 4).ok());
  f.clock.Advance(absl::Seconds(19));
  f.shard->CheckPatience();
  EXPECT_EQ(f.Step(), 4u);
  f.clock.Advance(absl::Seconds(2));
  f.shard->CheckPatience();
  EXPECT_EQ(f.Step(), 5u) << "the round still waits as if every round took "
                             "as long as the first";
}

TEST(ShardConsistency, AsyncAppliesEachPushAsItComes) {
  ShardConfig c = ExactSgdConfig(3);
  c.consistency = Async();
  Fixture f(c);
  ASSERT_TRUE(f.Push(1, 0, 0).ok());
  EXPECT_EQ(f.Step(), 1u);
  ASSERT_TRUE(f.Push(0, 0, 0).ok());  // 1 stale
  EXPECT_EQ(f.Step(), 2u);
  ASSERT_TRUE(f.Push(2, 0, 0).ok());  // 2 stale
  EXPECT_EQ(f.Step(), 3u);
  // Worker 0 asks for step 1 and gets the newest.
  auto p = f.PullNow(0, 1);
  ASSERT_TRUE(p.has_value() && p->ok());
  EXPECT_EQ((*p)->step(), 3u);
  // x3 = x0 - g1 - g0 - g2, each applied alone.
  std::vector<float> x = InitialWeights(kSmallElements);
  for (uint32_t w : {1u, 0u, 2u}) {
    const std::vector<float> g = Gradient(kSmallElements, w, 0);
    for (size_t i = 0; i < x.size(); ++i) x[i] -= g[i];
  }
  EXPECT_EQ(f.Weights(), x);
}

TEST(ShardConsistency, AWorkerStepsBehindGetsTheDeltasInARowNotASnapshot) {
  ShardConfig c = ExactSgdConfig(3, v1::CODEC_ONEBIT);
  c.optimizer.lr = 0.01f;
  c.consistency = Async();
  Fixture f(c);
  auto s0 = f.shard->PullBlocking(PullRequestFor(2, 0, -1, 0, true), kWait);
  ASSERT_TRUE(s0.ok()) << s0.status();
  std::vector<float> x = testing_util::DecodeAll(s0->weights());
  ASSERT_TRUE(f.Push(0, 0, 0).ok());
  ASSERT_TRUE(f.Push(1, 0, 0).ok());
  ASSERT_TRUE(f.Push(0, 1, 1).ok());
  ASSERT_EQ(f.Step(), 3u);
  // Worker 2 holds x_hat(0): three steps of deltas.
  auto r = f.shard->PullBlocking(
      PullRequestFor(2, 1, 0, s0->replica_checksum()), kWait);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 3u);
  ASSERT_EQ(r->kind(), v1::PULL_KIND_DELTA);
  ASSERT_EQ(r->later_deltas_size(), 2);
  EXPECT_EQ(r->weights().codec(), v1::CODEC_ONEBIT);
  auto add = [&x](const v1::EncodedTensor& t) {
    const std::vector<float> d = testing_util::DecodeAll(t);
    ASSERT_EQ(d.size(), x.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] += d[i];
  };
  add(r->weights());
  for (const v1::EncodedTensor& t : r->later_deltas()) add(t);
  EXPECT_EQ(ChecksumOf(x), r->replica_checksum());
  // The wrong checksum for step 0: a snapshot.
  auto wrong = f.shard->PullBlocking(
      PullRequestFor(2, 1, 0, s0->replica_checksum() ^ 1), kWait);
  ASSERT_TRUE(wrong.ok());
  EXPECT_EQ(wrong->kind(), v1::PULL_KIND_SNAPSHOT);
  EXPECT_EQ(wrong->later_deltas_size(), 0);
}

TEST(ShardConsistency, InverseScalingWeighsAStalePushByOneOverItsStaleness) {
  ShardConfig c = ExactSgdConfig(2);
  c.consistency = Async(/*scaled=*/true);
  Fixture f(c);
  for (uint64_t t = 0; t < 4; ++t) ASSERT_TRUE(f.Push(0, t, t).ok());
  ASSERT_EQ(f.Step(), 4u);
  ASSERT_TRUE(f.Push(1, 0, 0).ok());  // 4 stale: weight 1/4
  ASSERT_EQ(f.Step(), 5u);
  std::vector<float> x = InitialWeights(kSmallElements);
  for (uint64_t t = 0; t < 4; ++t) {
    const std::vector<float> g = Gradient(kSmallElements, 0, t);
    for (size_t i = 0; i < x.size(); ++i) x[i] -= g[i];
  }
  const std::vector<float> g = Gradient(kSmallElements, 1, 0);
  for (size_t i = 0; i < x.size(); ++i) x[i] -= 0.25f * g[i];
  std::vector<float> got = f.Weights();
  ASSERT_EQ(got.size(), x.size());
  // Unscaled, it would be off by 0.75 * |g| (up to 0.375).
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(got[i], x[i], 1e-6) << i;
}

TEST(ShardConsistency, APushNeverSplitsAcrossRounds) {
  // Chunks of 1024: four per push. Async: worker 0's first chunk opens a
  // round that passes worker 1 over in chunk 0, so all of worker 1's
  // chunks go to the next round, which completes as soon as it opens.
  ShardConfig c = ExactSgdConfig(2);
  c.chunk_elements = 1024;
  c.consistency = Async();
  Fixture f(c, 4096);
  auto chunk = [&](uint32_t w, uint32_t k) {
    const std::vector<float> g = Gradient(4096, w, 0);
    v1::PushRequest p = PushRequestFor(
        w, 0,
        Fp32Tensor(absl::MakeConstSpan(g).subspan(k * 1024, 1024)));
    p.set_chunk(k);
    return f.shard->Push(p);
  };
  ASSERT_TRUE(chunk(0, 0).ok());
  for (uint32_t k = 0; k < 4; ++k) ASSERT_TRUE(chunk(1, k).ok());
  EXPECT_EQ(f.Step(), 0u);  // round 0 waits for the rest of worker 0's push
  for (uint32_t k = 1; k < 4; ++k) ASSERT_TRUE(chunk(0, k).ok());
  EXPECT_EQ(f.Step(), 2u);  // round 0: worker 0 alone; round 1: worker 1
  std::vector<float> x = InitialWeights(4096);
  for (uint32_t w : {0u, 1u}) {
    const std::vector<float> g = Gradient(4096, w, 0);
    for (size_t i = 0; i < x.size(); ++i) x[i] -= g[i];
  }
  EXPECT_EQ(f.Weights(), x);
}

// The suite's hostile cases, in every mode: nothing they send changes the
// shard's state.
TEST(ShardConsistency, HostilePushesChangeNothingInEveryMode) {
  for (const ConsistencyConfig& mode :
       {ConsistencyConfig(), Ssp(0), Ssp(3), Async()}) {
    SCOPED_TRACE(DescribeConsistency(mode));
    ShardConfig c = ExactSgdConfig(3);
    c.consistency = mode;
    Fixture f(c);
    f.clock.Advance(absl::Seconds(1));  // ssp's patience ends at 1.5 s
    ASSERT_TRUE(f.Push(0, 0, 0).ok());
    const uint64_t step = f.Step();
    const uint64_t before = f.shard->StateChecksum();
    // A resend of the same push: acknowledged as a duplicate.
    auto dup = f.Push(0, 0, 0);
    ASSERT_TRUE(dup.ok()) << dup.status();
    EXPECT_TRUE(dup->duplicate());
    EXPECT_EQ(f.shard->StateChecksum(), before);
    // Far-future steps are refused, naming the step.
    for (uint64_t far : {step + 1, step + 1000, uint64_t{1} << 62}) {
      auto r = f.Push(1, far, 0);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(ReasonOf(r.status()), v1::REJECT_REASON_FUTURE_STEP);
      EXPECT_NE(r.status().message().find("the shard is at step"),
                std::string::npos);
    }
    // A pull of a far-future step likewise.
    auto far_pull = f.PullNow(1, step + 5);
    ASSERT_TRUE(far_pull.has_value());
    EXPECT_EQ(ReasonOf(far_pull->status()), v1::REJECT_REASON_FUTURE_STEP);
    // An unknown worker, a bad chunk, a payload of the wrong size.
    EXPECT_FALSE(f.Push(7, 0, 0).ok());
    v1::PushRequest bad_chunk = PushRequestFor(
        1, 0, Fp32Tensor(Gradient(kSmallElements, 1, 0)));
    bad_chunk.set_chunk(3);
    EXPECT_FALSE(f.shard->Push(bad_chunk).ok());
    v1::PushRequest short_push =
        PushRequestFor(1, 0, Fp32Tensor(Gradient(10, 1, 0)));
    auto sr = f.shard->Push(short_push);
    ASSERT_FALSE(sr.ok());
    EXPECT_EQ(ReasonOf(sr.status()), v1::REJECT_REASON_WRONG_SIZE);
    EXPECT_EQ(f.shard->StateChecksum(), before);
    EXPECT_EQ(f.Step(), step);
  }
}

TEST(ShardConsistency, APushStalerThanTheBoundIsDroppedNotApplied) {
  ShardConfig c = ExactSgdConfig(2);
  c.consistency = Ssp(1);
  c.lease_timeout = absl::Seconds(10);
  Fixture f(c);
  // Worker 1 goes silent; its lease expires and rounds go on without it.
  f.clock.Advance(absl::Seconds(11));
  ASSERT_TRUE(f.Push(0, 0, 0).ok());
  f.shard->CheckLeases();
  ASSERT_EQ(f.Step(), 1u);
  for (uint64_t t = 1; t < 4; ++t) ASSERT_TRUE(f.Push(0, t, t).ok());
  ASSERT_EQ(f.Step(), 4u);
  // It rejoins and sends the push it computed on step 0: 4 stale > 1.
  const std::vector<float> x0 = InitialWeights(kSmallElements);
  ASSERT_TRUE(f.shard->Register(RegisterRequestFor(1, 2, x0)).ok());
  const std::vector<float> before = f.Weights();
  auto r = f.Push(1, 0, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->round_lost());
  EXPECT_EQ(f.Weights(), before);
}

TEST(ShardConsistency, SspGoesOnWhenAStoppedWorkersLeaseExpires) {
  ShardConfig c = ExactSgdConfig(3);
  c.consistency = Ssp(1);
  c.lease_timeout = absl::Seconds(10);
  Fixture f(c);
  // Worker 2 pushes round 0 and stops; 0 and 1 run ahead to the bound.
  f.clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(f.Push(2, 0, 0).ok());
  ASSERT_TRUE(f.Push(0, 0, 0).ok());
  ASSERT_TRUE(f.Push(1, 0, 0).ok());
  ASSERT_EQ(f.Step(), 1u);
  f.clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(f.Push(0, 1, 1).ok());
  ASSERT_TRUE(f.Push(1, 1, 1).ok());
  f.clock.Advance(absl::Seconds(1));
  f.shard->CheckPatience();  // worker 2 is fresh only while patient
  ASSERT_EQ(f.Step(), 2u);
  ASSERT_TRUE(f.Push(0, 2, 2).ok());
  ASSERT_TRUE(f.Push(1, 2, 2).ok());
  // Worker 2 computes on version 1: round 2 must wait for it (1 + 1 <= 2).
  f.clock.Advance(absl::Seconds(3));
  f.shard->CheckPatience();
  EXPECT_EQ(f.Step(), 2u);
  f.clock.Advance(absl::Seconds(10));
  f.shard->CheckLeases();
  EXPECT_EQ(f.Step(), 3u) << "the round still waits for a dropped worker";
  // Its late push is refused as from a dropped worker.
  auto late = f.Push(2, 1, 1);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(ReasonOf(late.status()), v1::REJECT_REASON_DROPPED_WORKER);
}

TEST(ShardConsistency, SspShardRestartsFromItsCheckpoint) {
  ShardConfig c = ExactSgdConfig(2);
  c.consistency = Ssp(2);
  c.checkpoint_dir = testing_util::MakeTempDir("ssp_restart");
  std::vector<float> weights;
  {
    Fixture f(c);
    f.clock.Advance(absl::Seconds(1));
    ASSERT_TRUE(f.Push(0, 0, 0).ok());
    f.clock.Advance(absl::Seconds(1));
    f.shard->CheckPatience();  // worker 1 passed over in round 0
    ASSERT_EQ(f.Step(), 1u);
    ASSERT_TRUE(f.Push(1, 0, 0).ok());  // lands in round 1, 1 stale
    ASSERT_TRUE(f.Push(0, 1, 1).ok());
    ASSERT_EQ(f.Step(), 2u);
    weights = f.Weights();
    ASSERT_TRUE(f.shard->Close().ok());
  }
  FakeClock clock;
  ShardEnv env;
  env.clock = &clock;
  auto restarted = Shard::Create(c, env);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  Shard& s = **restarted;
  EXPECT_EQ(s.Status().current_step(), 2u);
  // Resends are duplicates; the next pushes go on from step 2.
  auto dup = s.Push(PushRequestFor(
      1, 0, Fp32Tensor(Gradient(kSmallElements, 1, 0))));
  ASSERT_TRUE(dup.ok()) << dup.status();
  EXPECT_TRUE(dup->duplicate());
  auto snap = s.PullBlocking(PullRequestFor(0, 2, -1, 0, true), kWait);
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ(testing_util::DecodeAll(snap->weights()), weights);
  for (uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(s.Push(PushRequestFor(
                          w, 2, Fp32Tensor(Gradient(kSmallElements, w, 2))))
                    .ok());
  }
  EXPECT_EQ(s.Status().current_step(), 3u);
}

TEST(ShardConsistency, AWarmupPushArrivingAfterTheFreezeIsDropped) {
  // 1-bit Adam (robust: compression-stage pushes are preconditioned)
  // freezing at step 2; worker 1 is cut off in round 1 and its warmup push
  // of step 1 arrives once the shard is in the compression stage.
  ShardConfig c = OneBitAdamConfig(2, /*freeze_step=*/2, v1::CODEC_FP32);
  c.consistency = Ssp(2);
  Fixture f(c);
  f.clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(f.Push(0, 0, 0).ok());
  ASSERT_TRUE(f.Push(1, 0, 0).ok());
  ASSERT_EQ(f.Step(), 1u);
  f.clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(f.Push(0, 1, 1).ok());
  f.clock.Advance(absl::Seconds(1));
  f.shard->CheckPatience();
  ASSERT_EQ(f.Step(), 2u);
  ASSERT_EQ(f.shard->Status().stage(), v1::OPTIMIZER_STAGE_COMPRESSION);
  const uint64_t before = f.shard->StateChecksum();
  auto late = f.Push(1, 1, 1);  // RAW, computed in the warmup
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_TRUE(late->round_lost());
  EXPECT_EQ(f.shard->StateChecksum(), before);
  // A RAW push computed after the freeze is refused, naming the space.
  auto wrong = f.Push(1, 2, 2);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(ReasonOf(wrong.status()), v1::REJECT_REASON_WRONG_SPACE);
  EXPECT_EQ(f.shard->StateChecksum(), before);
}

TEST(ShardConsistency, RegisterAnnouncesTheMode) {
  ShardConfig c = ExactSgdConfig(1);
  c.consistency = Ssp(4);
  FakeClock clock;
  ShardEnv env;
  env.clock = &clock;
  auto shard = Shard::Create(c, env);
  ASSERT_TRUE(shard.ok());
  auto r = (*shard)->Register(
      RegisterRequestFor(0, 1, InitialWeights(kSmallElements)));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->consistency(), v1::CONSISTENCY_SSP);
  EXPECT_EQ(r->max_staleness(), 4u);
  ShardConfig bad = c;
  bad.consistency.max_staleness = kMaxStaleness + 1;
  auto refused = Shard::Create(bad, env);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("max_staleness"),
            std::string::npos);
}

}  // namespace
}  // namespace pserver
