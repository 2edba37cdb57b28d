// ReplicaTracker (server/replica_tracker.h): x_hat follows x through the
// pull codec (x_hat += decode(encode(x - x_hat))), the checksums name
// x_hat before and after, and a pull gets the delta only when it proves it
// holds x_hat(step - 1); every other pull gets an fp32 snapshot of x_hat.
// Answers are built once per step and shared.
#include "server/replica_tracker.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/checksum.h"
#include "common/thread_pool.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"

namespace pserver {
namespace {

using testing_util::DecodeAll;
using testing_util::Gradient;
using testing_util::PullRequestFor;

std::unique_ptr<ReplicaTracker> Make(v1::Codec codec, ThreadPool* pool,
                                     uint32_t shard = 0) {
  auto t = ReplicaTracker::Create(shard, codec, v1::CodecParams(), pool);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

std::vector<float> Span(absl::Span<const float> s) {
  return std::vector<float>(s.begin(), s.end());
}

TEST(ReplicaTracker, CreateRefusesAPullCodecItCannotBuild) {
  ThreadPool pool(0);
  auto none = ReplicaTracker::Create(0, v1::CODEC_UNSPECIFIED, v1::CodecParams(),
                                     &pool);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  v1::CodecParams bad;
  bad.set_bits(9);
  auto q = ReplicaTracker::Create(0, v1::CODEC_QUANTIZE, bad, &pool);
  EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(q.status().message().find("bits"), std::string::npos) << q.status();
}

TEST(ReplicaTracker, ResetStartsFromTheWeightsWithoutADelta) {
  ThreadPool pool(0);
  auto t = Make(v1::CODEC_ONEBIT, &pool);
  std::vector<float> x = Gradient(300, 0, 0);
  t->Reset(x);
  EXPECT_EQ(Span(t->x_hat()), x);
  EXPECT_TRUE(t->delta().empty());
  EXPECT_EQ(t->checksum(), ChecksumOf(x));
  EXPECT_EQ(t->prev_checksum(), t->checksum());
}

TEST(ReplicaTracker, AdvanceFollowsXThroughThePullCodec) {
  ThreadPool pool(1);
  auto t = Make(v1::CODEC_ONEBIT, &pool);
  const uint64_t n = 1000;
  std::vector<float> x0 = Gradient(n, 0, 0);
  t->Reset(x0);
  const uint64_t c0 = t->checksum();
  std::vector<float> x1 = x0;
  std::vector<float> g = Gradient(n, 1, 1, 0.1f);
  for (uint64_t i = 0; i < n; ++i) x1[i] -= g[i];
  std::vector<float> scratch(n);
  const double residual = t->Advance(x1, 1, absl::MakeSpan(scratch));
  ASSERT_TRUE(!t->delta().empty());
  EXPECT_EQ(t->delta()[0].codec(), v1::CODEC_ONEBIT);
  // x_hat(1) = x_hat(0) + decode(delta), bit for bit what a worker computes.
  std::vector<float> want = x0;
  std::vector<float> d = DecodeAll(t->delta()[0]);
  ASSERT_EQ(d.size(), n);
  for (uint64_t i = 0; i < n; ++i) want[i] += d[i];
  EXPECT_EQ(Span(t->x_hat()), want);
  EXPECT_EQ(t->prev_checksum(), c0);
  EXPECT_EQ(t->checksum(), ChecksumOf(want));
  // The returned residual is ||x - x_hat||, and 1-bit is lossy.
  double r = 0;
  for (uint64_t i = 0; i < n; ++i) r += double{x1[i] - want[i]} * (x1[i] - want[i]);
  EXPECT_NEAR(residual, std::sqrt(r), 1e-6 * std::sqrt(r) + 1e-12);
  EXPECT_GT(residual, 0.0);
}

TEST(ReplicaTracker, DeltaIsTheSameOnEveryRunForShardAndStep) {
  ThreadPool pool(1);
  const uint64_t n = 500;
  std::vector<float> x0 = Gradient(n, 0, 0), x1 = Gradient(n, 2, 5);
  std::vector<float> scratch(n);
  auto a = Make(v1::CODEC_QUANTIZE, &pool, 3);
  auto b = Make(v1::CODEC_QUANTIZE, &pool, 3);
  a->Reset(x0);
  b->Reset(x0);
  a->Advance(x1, 7, absl::MakeSpan(scratch));
  b->Advance(x1, 7, absl::MakeSpan(scratch));
  ASSERT_TRUE(!a->delta().empty() && !b->delta().empty());
  EXPECT_EQ(a->delta()[0].SerializeAsString(), b->delta()[0].SerializeAsString());
  EXPECT_EQ(a->checksum(), b->checksum());
}

TEST(ReplicaTracker, Fp32PullCodecMakesXHatEqualXWithoutDelta) {
  ThreadPool pool(0);
  auto t = Make(v1::CODEC_FP32, &pool);
  std::vector<float> x0 = Gradient(64, 0, 0), x1 = Gradient(64, 0, 1);
  t->Reset(x0);
  std::vector<float> scratch(64);
  EXPECT_EQ(t->Advance(x1, 1, absl::MakeSpan(scratch)), 0.0);
  EXPECT_EQ(Span(t->x_hat()), x1);
  // A view of the weights, not a copy: no memory for x_hat.
  EXPECT_EQ(t->x_hat().data(), x1.data());
  EXPECT_TRUE(t->delta().empty());
  EXPECT_EQ(t->prev_checksum(), ChecksumOf(x0));
  EXPECT_EQ(t->checksum(), ChecksumOf(x1));
  // Every pull is a snapshot, even one that proves its replica.
  v1::PullResponse a = t->Answer(PullRequestFor(0, 1, 0, ChecksumOf(x0)), 1,
                           v1::OPTIMIZER_STAGE_WARMUP)->Parse();
  EXPECT_EQ(a.kind(), v1::PULL_KIND_SNAPSHOT);
  EXPECT_EQ(DecodeAll(a.weights()), x1);
}

TEST(ReplicaTracker, DeltaOnlyForAPullThatProvesItsReplica) {
  ThreadPool pool(0);
  auto t = Make(v1::CODEC_ONEBIT, &pool);
  const uint64_t n = 256;
  std::vector<float> x0 = Gradient(n, 0, 0), x1 = Gradient(n, 1, 1);
  t->Reset(x0);
  const uint64_t prev = t->checksum();
  std::vector<float> scratch(n);
  t->Advance(x1, 1, absl::MakeSpan(scratch));
  const auto stage = v1::OPTIMIZER_STAGE_WARMUP;

  v1::PullResponse delta = t->Answer(PullRequestFor(0, 1, 0, prev), 1, stage)->Parse();
  EXPECT_EQ(delta.kind(), v1::PULL_KIND_DELTA);
  EXPECT_EQ(delta.step(), 1u);
  EXPECT_EQ(delta.stage(), stage);
  EXPECT_EQ(delta.replica_checksum(), t->checksum());
  EXPECT_EQ(delta.weights().SerializeAsString(),
            t->delta()[0].SerializeAsString());

  const std::vector<float> x_hat = Span(t->x_hat());
  // Wrong checksum, wrong replica step, wrong step, or asking for one.
  for (const v1::PullRequest& req :
       {PullRequestFor(0, 1, 0, prev + 1), PullRequestFor(0, 1, -1, prev),
        PullRequestFor(0, 0, 0, prev), PullRequestFor(0, 1, 0, prev, true)}) {
    v1::PullResponse s = t->Answer(req, 1, stage)->Parse();
    EXPECT_EQ(s.kind(), v1::PULL_KIND_SNAPSHOT) << req.ShortDebugString();
    EXPECT_EQ(s.weights().codec(), v1::CODEC_FP32);
    EXPECT_EQ(DecodeAll(s.weights()), x_hat);
    EXPECT_EQ(s.replica_checksum(), t->checksum());
  }
}

// A pull that proves the worker holds x_hat(step) itself (its step and
// checksum) is answered with nothing; a wrong checksum or a wish for a
// snapshot gets the snapshot.
TEST(ReplicaTracker, NothingForAPullThatProvesItHoldsThisStep) {
  ThreadPool pool(0);
  auto t = Make(v1::CODEC_ONEBIT, &pool);
  const uint64_t n = 256;
  t->Reset(Gradient(n, 0, 0));
  const auto stage = v1::OPTIMIZER_STAGE_WARMUP;
  const uint64_t sum = t->checksum();
  v1::PullResponse cur = t->Answer(PullRequestFor(0, 0, 0, sum), 0, stage)->Parse();
  EXPECT_EQ(cur.kind(), v1::PULL_KIND_CURRENT);
  EXPECT_EQ(cur.step(), 0u);
  EXPECT_EQ(cur.replica_checksum(), sum);
  EXPECT_TRUE(cur.weights().payload().empty());
  EXPECT_EQ(cur.later_deltas_size(), 0);
  for (const v1::PullRequest& req :
       {PullRequestFor(0, 0, 0, sum + 1), PullRequestFor(0, 0, 0, sum, true)}) {
    v1::PullResponse s = t->Answer(req, 0, stage)->Parse();
    EXPECT_EQ(s.kind(), v1::PULL_KIND_SNAPSHOT) << req.ShortDebugString();
    EXPECT_EQ(DecodeAll(s.weights()), Span(t->x_hat()));
  }
  // After a round: the same proof is of the step before, not this one.
  std::vector<float> scratch(n);
  t->Advance(Gradient(n, 1, 1), 1, absl::MakeSpan(scratch));
  EXPECT_EQ(t->Answer(PullRequestFor(0, 1, 1, sum), 1, stage)->Parse().kind(),
            v1::PULL_KIND_SNAPSHOT);
  EXPECT_EQ(
      t->Answer(PullRequestFor(0, 1, 1, t->checksum()), 1, stage)->Parse().kind(),
      v1::PULL_KIND_CURRENT);
}

TEST(ReplicaTracker, AnswersAreSharedWithinAStepAndRebuiltAfter) {
  ThreadPool pool(0);
  auto t = Make(v1::CODEC_ONEBIT, &pool);
  const uint64_t n = 128;
  t->Reset(Gradient(n, 0, 0));
  std::vector<float> scratch(n);
  uint64_t prev = t->checksum();
  t->Advance(Gradient(n, 0, 1), 1, absl::MakeSpan(scratch));
  const auto stage = v1::OPTIMIZER_STAGE_WARMUP;
  PullAnswer d1 = t->Answer(PullRequestFor(0, 1, 0, prev), 1, stage);
  PullAnswer d2 = t->Answer(PullRequestFor(5, 1, 0, prev), 1, stage);
  PullAnswer s1 = t->Answer(PullRequestFor(0, 1, -1, 0), 1, stage);
  PullAnswer s2 = t->Answer(PullRequestFor(3, 1, 0, 0, true), 1, stage);
  EXPECT_EQ(d1.get(), d2.get());  // one buffer, not a copy per pull
  EXPECT_EQ(s1.get(), s2.get());
  EXPECT_NE(d1.get(), s1.get());
  // Another stage for the same step is another answer.
  PullAnswer s3 = t->Answer(PullRequestFor(0, 1, -1, 0), 1,
                            v1::OPTIMIZER_STAGE_COMPRESSION);
  EXPECT_NE(s3.get(), s1.get());
  EXPECT_EQ(s3->Parse().stage(), v1::OPTIMIZER_STAGE_COMPRESSION);
  // The next step gets fresh answers; the old ones stay valid for holders.
  prev = t->checksum();
  const std::vector<float> old_hat = Span(t->x_hat());
  t->Advance(Gradient(n, 0, 2), 2, absl::MakeSpan(scratch));
  PullAnswer d3 = t->Answer(PullRequestFor(0, 2, 1, prev), 2, stage);
  EXPECT_EQ(d3->Parse().kind(), v1::PULL_KIND_DELTA);
  EXPECT_EQ(d3->Parse().step(), 2u);
  EXPECT_EQ(d1->Parse().step(), 1u);
  EXPECT_EQ(DecodeAll(s1->Parse().weights()), old_hat);
  // A snapshot (fp32, slice-sized) lives only while a pull holds it; the
  // small delta stays cached for the step.
  std::weak_ptr<const PullChunk> snapshot = s3, delta = d3;
  s3.reset();
  d3.reset();
  PullAnswer s4 = t->Answer(PullRequestFor(0, 2, -1, 0), 2, stage);
  snapshot = s4;
  s4.reset();
  EXPECT_TRUE(snapshot.expired());
  EXPECT_FALSE(delta.expired());
}

TEST(ReplicaTracker, InvalidateSendsSnapshotsUntilTheNextAdvance) {
  ThreadPool pool(0);
  auto t = Make(v1::CODEC_ONEBIT, &pool);
  const uint64_t n = 128;
  t->Reset(Gradient(n, 0, 0));
  std::vector<float> scratch(n);
  t->Advance(Gradient(n, 0, 1), 1, absl::MakeSpan(scratch));
  const uint64_t prev = t->prev_checksum();
  const uint64_t cur = t->checksum();
  ASSERT_EQ(t->Answer(PullRequestFor(0, 1, 0, prev), 1,
                      v1::OPTIMIZER_STAGE_WARMUP)->Parse().kind(),
            v1::PULL_KIND_DELTA);
  // The shard skipped rounds (say to step 9): nobody's replica is x_hat(8).
  t->Invalidate();
  EXPECT_TRUE(t->delta().empty());
  EXPECT_EQ(t->checksum(), cur);
  EXPECT_EQ(t->prev_checksum(), cur);
  for (const v1::PullRequest& req :
       {PullRequestFor(0, 9, 8, prev), PullRequestFor(0, 9, 8, cur)}) {
    EXPECT_EQ(t->Answer(req, 9, v1::OPTIMIZER_STAGE_WARMUP)->Parse().kind(),
              v1::PULL_KIND_SNAPSHOT);
  }
  // A worker holding the snapshot (checksum cur) gets the next delta.
  t->Advance(Gradient(n, 0, 10), 10, absl::MakeSpan(scratch));
  EXPECT_EQ(t->Answer(PullRequestFor(0, 10, 9, cur), 10,
                      v1::OPTIMIZER_STAGE_WARMUP)->Parse().kind(),
            v1::PULL_KIND_DELTA);
}

TEST(ReplicaTracker, RestoreTakesTheCheckpointedReplica) {
  ThreadPool pool(0);
  auto src = Make(v1::CODEC_ONEBIT, &pool);
  const uint64_t n = 64;
  src->Reset(Gradient(n, 0, 0));
  std::vector<float> scratch(n);
  src->Advance(Gradient(n, 0, 1), 4, absl::MakeSpan(scratch));

  auto t = Make(v1::CODEC_ONEBIT, &pool);
  t->Restore(Span(src->x_hat()), src->delta(), src->checksum(),
             src->prev_checksum());
  EXPECT_EQ(Span(t->x_hat()), Span(src->x_hat()));
  EXPECT_EQ(t->checksum(), src->checksum());
  EXPECT_EQ(t->prev_checksum(), src->prev_checksum());
  // A worker that held x_hat(3) before the restart still gets the delta.
  v1::PullResponse a = t->Answer(PullRequestFor(0, 4, 3, src->prev_checksum()), 4,
                           v1::OPTIMIZER_STAGE_WARMUP)->Parse();
  EXPECT_EQ(a.kind(), v1::PULL_KIND_DELTA);
  EXPECT_EQ(a.weights().SerializeAsString(), src->delta()[0].SerializeAsString());
}

TEST(ReplicaTracker, NonFiniteWeightsFallBackToSnapshots) {
  ThreadPool pool(0);
  auto t = Make(v1::CODEC_ONEBIT, &pool);
  const uint64_t n = 32;
  t->Reset(std::vector<float>(n, 1.0f));
  const uint64_t prev = t->checksum();
  std::vector<float> x(n, 2.0f);
  x[5] = std::numeric_limits<float>::quiet_NaN();  // a diverged run
  std::vector<float> scratch(n);
  t->Advance(x, 1, absl::MakeSpan(scratch));
  EXPECT_TRUE(t->delta().empty());
  EXPECT_EQ(t->prev_checksum(), prev);
  v1::PullResponse a = t->Answer(PullRequestFor(0, 1, 0, prev), 1,
                           v1::OPTIMIZER_STAGE_WARMUP)->Parse();
  EXPECT_EQ(a.kind(), v1::PULL_KIND_SNAPSHOT);
  EXPECT_EQ(a.replica_checksum(), t->checksum());
}

}  // namespace
}  // namespace pserver
