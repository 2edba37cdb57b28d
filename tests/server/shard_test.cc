// server::Shard driven directly (no gRPC): rounds, order independence,
// duplicates, waiting pulls, replica tracking and the 1-bit Adam freeze.
#include "server/shard.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/checksum.h"
#include "common/codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"
#include "tests/test_util/test_helpers.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;
using testing_util::DecodeAll;
using testing_util::ExactSgdConfig;
using testing_util::Fp32Tensor;
using testing_util::OneBitAdamConfig;
using testing_util::Gradient;
using testing_util::InitialWeights;
using testing_util::kSmallElements;
using testing_util::PullRequestFor;
using testing_util::PushRequestFor;
using testing_util::RegisterRequestFor;
using testing_util::Replica;

constexpr uint64_t kN = kSmallElements;


std::unique_ptr<Shard> MakeRegisteredShard(const ShardConfig& c,
                                           const std::vector<float>& x0) {
  absl::StatusOr<std::unique_ptr<Shard>> shard = Shard::Create(c, nullptr);
  EXPECT_TRUE(shard.ok()) << shard.status();
  if (!shard.ok()) return nullptr;
  for (uint32_t w = 0; w < c.num_workers; ++w) {
    absl::StatusOr<v1::RegisterResponse> r =
        (*shard)->Register(RegisterRequestFor(w, c.num_workers, x0));
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) {
      EXPECT_EQ(r->initialized_model(), w == 0);
    }
  }
  return std::move(shard).value();
}

// Pushes every worker's fp32 gradient for `step` in the order given.
void PushRound(Shard& shard, uint64_t step, const std::vector<uint32_t>& order,
               v1::GradientSpace space = v1::GRADIENT_SPACE_RAW) {
  for (uint32_t w : order) {
    absl::StatusOr<v1::PushResponse> r = shard.Push(
        PushRequestFor(w, step, Fp32Tensor(Gradient(kN, w, step)), space));
    ASSERT_TRUE(r.ok()) << "worker " << w << " step " << step << ": "
                        << r.status();
    EXPECT_FALSE(r->duplicate());
  }
}

std::vector<float> Snapshot(Shard& shard, uint64_t step) {
  absl::StatusOr<v1::PullResponse> r = shard.PullBlocking(
      PullRequestFor(0, step, -1, 0, /*want_snapshot=*/true), absl::Seconds(10));
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  EXPECT_EQ(r->kind(), v1::PULL_KIND_SNAPSHOT);
  EXPECT_EQ(r->weights().codec(), v1::CODEC_FP32);
  return DecodeAll(r->weights());
}

bool SameBits(absl::Span<const float> a, absl::Span<const float> b) {
  return testing_util::BitEqual(a, b);
}

TEST(Shard, RoundResultDoesNotDependOnArrivalOrder) {
  const std::vector<std::vector<uint32_t>> orders = {
      {0, 1, 2, 3}, {3, 2, 1, 0}, {2, 0, 3, 1}, {1, 3, 0, 2}, {3, 0, 1, 2}};
  const std::vector<float> x0 = InitialWeights(kN);
  const uint64_t kSteps = 6;
  std::vector<uint64_t> checksums;
  std::vector<std::vector<float>> weights;
  for (size_t o = 0; o < orders.size(); ++o) {
    std::unique_ptr<Shard> shard =
        MakeRegisteredShard(OneBitAdamConfig(4, /*freeze_step=*/100), x0);
    ASSERT_NE(shard, nullptr);
    for (uint64_t t = 0; t < kSteps; ++t) {
      // A different permutation every step, too.
      PushRound(*shard, t, orders[(o + t) % orders.size()]);
    }
    v1::GetStatusResponse st = shard->Status();
    EXPECT_EQ(st.current_step(), kSteps);
    checksums.push_back(st.state_checksum());
    weights.push_back(Snapshot(*shard, kSteps));
  }
  for (size_t o = 1; o < orders.size(); ++o) {
    EXPECT_EQ(checksums[o], checksums[0]) << "order " << o;
    EXPECT_TRUE(SameBits(weights[o], weights[0])) << "order " << o;
  }
  EXPECT_FALSE(SameBits(weights[0], x0));
}

TEST(Shard, ConcurrentPushesGiveTheSameStateAsSequentialOnes) {
  const std::vector<float> x0 = InitialWeights(kN);
  const uint64_t kSteps = 5;
  std::unique_ptr<Shard> sequential =
      MakeRegisteredShard(OneBitAdamConfig(4, 3), x0);
  std::unique_ptr<Shard> concurrent =
      MakeRegisteredShard(OneBitAdamConfig(4, 3), x0);
  ASSERT_NE(sequential, nullptr);
  ASSERT_NE(concurrent, nullptr);
  for (uint64_t t = 0; t < kSteps; ++t) {
    v1::GradientSpace space = t >= 3 ? v1::GRADIENT_SPACE_PRECONDITIONED
                                     : v1::GRADIENT_SPACE_RAW;
    PushRound(*sequential, t, {0, 1, 2, 3}, space);
  }
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (uint64_t t = 0; t < kSteps; ++t) {
        v1::GradientSpace space = t >= 3 ? v1::GRADIENT_SPACE_PRECONDITIONED
                                         : v1::GRADIENT_SPACE_RAW;
        absl::StatusOr<v1::PushResponse> r = concurrent->Push(
            PushRequestFor(w, t, Fp32Tensor(Gradient(kN, w, t)), space));
        EXPECT_TRUE(r.ok()) << r.status();
        // Wait for the round before pushing the next step.
        absl::StatusOr<v1::PullResponse> p = concurrent->PullBlocking(
            PullRequestFor(w, t + 1, -1, 0), absl::Seconds(20));
        EXPECT_TRUE(p.ok()) << p.status();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(concurrent->Status().current_step(), kSteps);
  EXPECT_EQ(concurrent->Status().state_checksum(),
            sequential->Status().state_checksum());
  EXPECT_TRUE(SameBits(Snapshot(*concurrent, kSteps), Snapshot(*sequential, kSteps)));
}

TEST(Shard, MeanIsSumOverWorkersInWorkerIdOrder) {
  const std::vector<float> x0 = InitialWeights(kN);
  std::vector<std::vector<float>> g;
  for (uint32_t w = 0; w < 4; ++w) g.push_back(Gradient(kN, w, 0));
  // Element 0 tells summation orders apart: in worker-id order
  // ((1e8 + 1) - 1e8) + 1 = 1 in float; in the arrival order used below
  // (3, 1, 2, 0) it is ((1 + 1) - 1e8) + 1e8 = 0.
  g[0][0] = 1e8f;
  g[1][0] = 1.0f;
  g[2][0] = -1e8f;
  g[3][0] = 1.0f;

  std::unique_ptr<Shard> shard = MakeRegisteredShard(ExactSgdConfig(4), x0);
  ASSERT_NE(shard, nullptr);
  for (uint32_t w : {3u, 1u, 2u, 0u}) {
    ASSERT_TRUE(shard->Push(PushRequestFor(w, 0, Fp32Tensor(g[w]))).ok());
  }
  std::vector<float> want(kN);
  for (uint64_t i = 0; i < kN; ++i) {
    float sum = 0.0f;
    for (uint32_t w = 0; w < 4; ++w) sum += g[w][i];
    want[i] = x0[i] - sum * (1.0f / 4);
  }
  std::vector<float> got = Snapshot(*shard, 1);
  ASSERT_EQ(got.size(), kN);
  EXPECT_EQ(got[0], x0[0] - 0.25f);
  EXPECT_TRUE(SameBits(got, want));
}

TEST(Shard, DuplicatePushIsAcknowledgedAndNotAppliedTwice) {
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard = MakeRegisteredShard(OneBitAdamConfig(4, 100), x0);
  ASSERT_NE(shard, nullptr);

  ASSERT_TRUE(shard->Push(PushRequestFor(0, 0, Fp32Tensor(Gradient(kN, 0, 0)))).ok());
  const uint64_t one_pushed = shard->Status().state_checksum();
  // Same (worker, step) again, even with a different payload: acknowledged.
  absl::StatusOr<v1::PushResponse> dup =
      shard->Push(PushRequestFor(0, 0, Fp32Tensor(Gradient(kN, 0, 7))));
  ASSERT_TRUE(dup.ok()) << dup.status();
  EXPECT_TRUE(dup->duplicate());
  EXPECT_EQ(dup->current_step(), 0u);
  EXPECT_EQ(shard->Status().state_checksum(), one_pushed);
  EXPECT_EQ(shard->Status().pushes_pending(), 1u);

  PushRound(*shard, 0, {1, 2, 3});
  v1::GetStatusResponse after_round = shard->Status();
  EXPECT_EQ(after_round.current_step(), 1u);
  for (uint32_t w = 0; w < 4; ++w) {
    dup = shard->Push(PushRequestFor(w, 0, Fp32Tensor(Gradient(kN, w, 0))));
    ASSERT_TRUE(dup.ok()) << dup.status();
    EXPECT_TRUE(dup->duplicate());
    EXPECT_EQ(dup->current_step(), 1u);
  }
  EXPECT_EQ(shard->Status().state_checksum(), after_round.state_checksum());
  EXPECT_EQ(shard->Status().pushes_pending(), 0u);

  // The same result as a shard that never saw a duplicate.
  std::unique_ptr<Shard> clean = MakeRegisteredShard(OneBitAdamConfig(4, 100), x0);
  ASSERT_NE(clean, nullptr);
  PushRound(*clean, 0, {0, 1, 2, 3});
  EXPECT_EQ(clean->Status().state_checksum(), after_round.state_checksum());
}

TEST(Shard, PushForAFutureStepIsRefusedWithTheCurrentStep) {
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard = MakeRegisteredShard(OneBitAdamConfig(2, 100), x0);
  ASSERT_NE(shard, nullptr);
  const uint64_t before = shard->Status().state_checksum();
  absl::StatusOr<v1::PushResponse> r =
      shard->Push(PushRequestFor(0, 1, Fp32Tensor(Gradient(kN, 0, 1))));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("at step 0"));
  EXPECT_EQ(shard->Status().state_checksum(), before);

  PushRound(*shard, 0, {0, 1});
  const uint64_t after_round = shard->Status().state_checksum();
  r = shard->Push(PushRequestFor(1, 5, Fp32Tensor(Gradient(kN, 1, 5))));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("step is 5"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("at step 1"));
  EXPECT_EQ(shard->Status().state_checksum(), after_round);
}

TEST(Shard, PullOfTheNextStepWaitsForTheRound) {
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard = MakeRegisteredShard(ExactSgdConfig(2), x0);
  ASSERT_NE(shard, nullptr);

  // A worker that has not pushed the round would wait for itself forever:
  // its pull is refused at once (regression: a shard restart lost a push).
  absl::StatusOr<v1::PullResponse> early =
      shard->PullBlocking(PullRequestFor(1, 1, -1, 0), absl::Seconds(5));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(early.status().message()),
              HasSubstr("has not pushed step 0"));

  ASSERT_TRUE(shard->Push(PushRequestFor(0, 0, Fp32Tensor(Gradient(kN, 0, 0)))).ok());
  absl::Notification answered;
  absl::Status status;
  v1::PullResponse response;
  shard->Pull(PullRequestFor(0, 1, -1, 0), [&](absl::Status s, PullAnswer r) {
    status = s;
    if (r != nullptr) response = r->Parse();
    answered.Notify();
  });
  EXPECT_FALSE(answered.HasBeenNotified());
  // Half a round is not a round.
  EXPECT_FALSE(answered.WaitForNotificationWithTimeout(absl::Milliseconds(50)));

  // A blocking pull from another thread waits as well.
  absl::StatusOr<v1::PullResponse> blocking;
  std::thread waiter([&] {
    blocking = shard->PullBlocking(PullRequestFor(0, 1, -1, 0), absl::Seconds(20));
  });
  ASSERT_TRUE(shard->Push(PushRequestFor(1, 0, Fp32Tensor(Gradient(kN, 1, 0)))).ok());
  // Waiting pulls are answered before the last push returns.
  EXPECT_TRUE(answered.HasBeenNotified());
  waiter.join();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(response.step(), 1u);
  ASSERT_TRUE(blocking.ok()) << blocking.status();
  EXPECT_EQ(blocking->step(), 1u);
  EXPECT_EQ(blocking->replica_checksum(), response.replica_checksum());
  EXPECT_EQ(response.replica_checksum(), shard->Status().replica_checksum());
}

TEST(Shard, PullBlockingTimesOutWithDeadlineExceeded) {
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard = MakeRegisteredShard(ExactSgdConfig(2), x0);
  ASSERT_NE(shard, nullptr);
  ASSERT_TRUE(shard->Push(PushRequestFor(0, 0, Fp32Tensor(Gradient(kN, 0, 0)))).ok());
  const uint64_t before = shard->Status().state_checksum();
  absl::StatusOr<v1::PullResponse> r =
      shard->PullBlocking(PullRequestFor(0, 1, -1, 0), absl::Milliseconds(30));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("step 1"));
  EXPECT_EQ(shard->Status().state_checksum(), before);

  // More than one step ahead is refused at once.
  r = shard->PullBlocking(PullRequestFor(0, 2, -1, 0), absl::Seconds(10));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("at step 0"));

  // The timed-out waiter is gone and the shard goes on.
  PushRound(*shard, 0, {1});
  r = shard->PullBlocking(PullRequestFor(0, 1, -1, 0), absl::Seconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 1u);
}

TEST(Shard, ShutdownAnswersWaitingPullsWithUnavailable) {
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard = MakeRegisteredShard(ExactSgdConfig(2), x0);
  ASSERT_NE(shard, nullptr);
  ASSERT_TRUE(shard->Push(PushRequestFor(0, 0, Fp32Tensor(Gradient(kN, 0, 0)))).ok());
  absl::StatusOr<v1::PullResponse> r;
  std::thread waiter([&] {
    r = shard->PullBlocking(PullRequestFor(0, 1, -1, 0), absl::Seconds(20));
  });
  // Wait until the pull is parked; a pull arriving after Shutdown is refused
  // with the same code, so either ordering ends in UNAVAILABLE.
  absl::SleepFor(absl::Milliseconds(20));
  shard->Shutdown();
  waiter.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(shard->Push(PushRequestFor(1, 0, Fp32Tensor(Gradient(kN, 1, 0))))
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
}

TEST(Shard, TrackedReplicaGetsDeltaOthersGetSnapshot) {
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard =
      MakeRegisteredShard(OneBitAdamConfig(2, 100, v1::CODEC_ONEBIT), x0);
  ASSERT_NE(shard, nullptr);
  PushRound(*shard, 0, {0, 1});
  const uint64_t x0_checksum = ChecksumOf(x0);
  const uint64_t state = shard->Status().state_checksum();

  auto pull = [&](int64_t replica_step, uint64_t checksum, bool want_snapshot) {
    absl::StatusOr<v1::PullResponse> r = shard->PullBlocking(
        PullRequestFor(0, 1, replica_step, checksum, want_snapshot),
        absl::Seconds(10));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : v1::PullResponse();
  };
  v1::PullResponse delta = pull(0, x0_checksum, false);
  EXPECT_EQ(delta.kind(), v1::PULL_KIND_DELTA);
  EXPECT_EQ(delta.weights().codec(), v1::CODEC_ONEBIT);
  EXPECT_EQ(delta.weights().num_elements(), kN);
  EXPECT_EQ(delta.step(), 1u);
  Replica tracked{x0, 0};
  ASSERT_TRUE(tracked.Apply(delta));
  EXPECT_EQ(ChecksumOf(tracked.x), delta.replica_checksum());

  struct Case {
    const char* what;
    int64_t replica_step;
    uint64_t checksum;
    bool want_snapshot;
  };
  for (const Case& c : {Case{"wrong checksum", 0, x0_checksum ^ 1, false},
                        Case{"no replica", -1, 0, false},
                        Case{"replica_step -1 with a checksum", -1, x0_checksum, false},
                        Case{"replica already current", 1, x0_checksum, false},
                        Case{"want_snapshot", 0, x0_checksum, true}}) {
    SCOPED_TRACE(c.what);
    v1::PullResponse snap = pull(c.replica_step, c.checksum, c.want_snapshot);
    EXPECT_EQ(snap.kind(), v1::PULL_KIND_SNAPSHOT);
    EXPECT_EQ(snap.weights().codec(), v1::CODEC_FP32);
    EXPECT_EQ(snap.replica_checksum(), delta.replica_checksum());
    // The snapshot is the replica, not the weights: delta and snapshot agree.
    EXPECT_TRUE(SameBits(DecodeAll(snap.weights()), tracked.x));
  }
  // Pulls never change state.
  EXPECT_EQ(shard->Status().state_checksum(), state);
  EXPECT_EQ(shard->Status().replica_checksum(), delta.replica_checksum());
}

class ShardPullCodec : public ::testing::TestWithParam<v1::Codec> {};

TEST_P(ShardPullCodec, DeltasKeepTheReplicaChecksumInSync) {
  const std::vector<float> x0 = InitialWeights(kN);
  ShardConfig config = OneBitAdamConfig(2, /*freeze_step=*/10, GetParam());
  config.pull_params.set_k_fraction(0.05);
  std::unique_ptr<Shard> shard = MakeRegisteredShard(config, x0);
  ASSERT_NE(shard, nullptr);
  Replica replica{x0, 0};
  const uint64_t kSteps = 40;
  for (uint64_t t = 0; t < kSteps; ++t) {
    PushRound(*shard, t, {1, 0},
              t >= 10 ? v1::GRADIENT_SPACE_PRECONDITIONED
                      : v1::GRADIENT_SPACE_RAW);
    absl::StatusOr<v1::PullResponse> r = shard->PullBlocking(
        PullRequestFor(0, t + 1, replica.step, ChecksumOf(replica.x)),
        absl::Seconds(10));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->kind(), v1::PULL_KIND_DELTA) << "step " << t + 1;
    EXPECT_EQ(r->weights().codec(), GetParam());
    ASSERT_TRUE(replica.Apply(*r));
    ASSERT_EQ(ChecksumOf(replica.x), r->replica_checksum()) << "step " << t + 1;
    EXPECT_EQ(r->replica_checksum(), shard->Status().replica_checksum());
    EXPECT_EQ(r->stage(), t + 1 >= 10 ? v1::OPTIMIZER_STAGE_COMPRESSION
                                      : v1::OPTIMIZER_STAGE_WARMUP);
  }
  // A fresh worker's snapshot is the same replica.
  absl::StatusOr<v1::PullResponse> snap = shard->PullBlocking(
      PullRequestFor(1, kSteps, -1, 0), absl::Seconds(10));
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ(snap->kind(), v1::PULL_KIND_SNAPSHOT);
  EXPECT_TRUE(SameBits(DecodeAll(snap->weights()), replica.x));
  EXPECT_FALSE(SameBits(replica.x, x0));
}

INSTANTIATE_TEST_SUITE_P(Codecs, ShardPullCodec,
                         ::testing::Values(v1::CODEC_ONEBIT, v1::CODEC_TOPK),
                         [](const ::testing::TestParamInfo<v1::Codec>& info) {
                           return CodecName(info.param);
                         });

TEST(Shard, Fp32PullCodecAlwaysSendsSnapshotsOfTheWeights) {
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard =
      MakeRegisteredShard(ExactSgdConfig(2, v1::CODEC_FP32), x0);
  ASSERT_NE(shard, nullptr);
  std::vector<float> x = x0;
  for (uint64_t t = 0; t < 5; ++t) {
    const uint64_t replica_checksum = ChecksumOf(x);
    PushRound(*shard, t, {0, 1});
    std::vector<float> g0 = Gradient(kN, 0, t), g1 = Gradient(kN, 1, t);
    for (uint64_t i = 0; i < kN; ++i) x[i] -= (0.0f + g0[i] + g1[i]) * 0.5f;
    // Even a perfectly tracked replica gets a snapshot.
    absl::StatusOr<v1::PullResponse> r = shard->PullBlocking(
        PullRequestFor(0, t + 1, static_cast<int64_t>(t), replica_checksum),
        absl::Seconds(10));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->kind(), v1::PULL_KIND_SNAPSHOT);
    EXPECT_EQ(r->weights().codec(), v1::CODEC_FP32);
    std::vector<float> got = DecodeAll(r->weights());
    EXPECT_TRUE(SameBits(got, x)) << "step " << t + 1;
    EXPECT_EQ(r->replica_checksum(), ChecksumOf(x));
  }
}

TEST(Shard, FrozenVarianceIsServedOnlyAfterTheFreeze) {
  const std::vector<float> x0 = InitialWeights(kN);
  ShardConfig config = OneBitAdamConfig(2, /*freeze_step=*/2);
  std::unique_ptr<Shard> shard = MakeRegisteredShard(config, x0);
  ASSERT_NE(shard, nullptr);
  v1::GetFrozenVarianceRequest req;
  req.set_worker_id(1);
  for (uint64_t t = 0; t < 2; ++t) {
    absl::StatusOr<v1::GetFrozenVarianceResponse> v = shard->GetFrozenVariance(req);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(v.status().message()), HasSubstr("frozen from step 2"));
    PushRound(*shard, t, {0, 1});
  }
  absl::StatusOr<v1::GetFrozenVarianceResponse> v = shard->GetFrozenVariance(req);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->freeze_step(), 2u);
  EXPECT_EQ(v->eps(), config.optimizer.eps);
  EXPECT_EQ(v->variance().codec(), v1::CODEC_FP32);
  std::vector<float> var = DecodeAll(v->variance());
  ASSERT_EQ(var.size(), kN);
  for (uint64_t i = 0; i < kN; ++i) {
    ASSERT_TRUE(std::isfinite(var[i]) && var[i] > 0) << i << ": " << var[i];
  }
  // Frozen: more rounds leave it bitwise alone.
  PushRound(*shard, 2, {0, 1}, v1::GRADIENT_SPACE_PRECONDITIONED);
  absl::StatusOr<v1::GetFrozenVarianceResponse> again = shard->GetFrozenVariance(req);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->variance().payload(), v->variance().payload());
  // The slice is one chunk here: chunk 1 does not exist.
  req.set_chunk(1);
  absl::StatusOr<v1::GetFrozenVarianceResponse> past =
      shard->GetFrozenVariance(req);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(past.status().message()),
              HasSubstr("chunk is 1; expected 0..0"));

  req.set_worker_id(2);
  EXPECT_EQ(shard->GetFrozenVariance(req).status().code(),
            absl::StatusCode::kInvalidArgument);

  std::unique_ptr<Shard> sgd = MakeRegisteredShard(ExactSgdConfig(2), x0);
  ASSERT_NE(sgd, nullptr);
  req.set_worker_id(0);
  absl::StatusOr<v1::GetFrozenVarianceResponse> none = sgd->GetFrozenVariance(req);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("sgd"));
}

TEST(Shard, FreezeFlipsTheExpectedGradientSpaceInRobustMode) {
  const std::vector<float> x0 = InitialWeights(kN);
  ShardConfig config = OneBitAdamConfig(2, /*freeze_step=*/2);
  absl::StatusOr<std::unique_ptr<Shard>> created = Shard::Create(config, nullptr);
  ASSERT_TRUE(created.ok());
  Shard& shard = **created;
  absl::StatusOr<v1::RegisterResponse> reg =
      shard.Register(RegisterRequestFor(0, 2, x0));
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(reg->compression_space(), v1::GRADIENT_SPACE_PRECONDITIONED);
  EXPECT_EQ(reg->freeze_step(), 2u);
  EXPECT_EQ(reg->stage(), v1::OPTIMIZER_STAGE_WARMUP);
  ASSERT_TRUE(shard.Register(RegisterRequestFor(1, 2, x0)).ok());

  // Warmup: preconditioned pushes are refused, raw (or unspecified) accepted.
  uint64_t before = shard.Status().state_checksum();
  absl::StatusOr<v1::PushResponse> r = shard.Push(PushRequestFor(
      0, 0, Fp32Tensor(Gradient(kN, 0, 0)), v1::GRADIENT_SPACE_PRECONDITIONED));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("space"));
  EXPECT_EQ(shard.Status().state_checksum(), before);
  PushRound(shard, 0, {0, 1}, v1::GRADIENT_SPACE_UNSPECIFIED);
  PushRound(shard, 1, {0, 1}, v1::GRADIENT_SPACE_RAW);
  EXPECT_EQ(shard.Status().stage(), v1::OPTIMIZER_STAGE_COMPRESSION);

  // Compression stage: raw pushes are refused and change nothing.
  before = shard.Status().state_checksum();
  for (v1::GradientSpace raw : {v1::GRADIENT_SPACE_RAW, v1::GRADIENT_SPACE_UNSPECIFIED}) {
    r = shard.Push(PushRequestFor(0, 2, Fp32Tensor(Gradient(kN, 0, 2)), raw));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("space is RAW"));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("PRECONDITIONED"));
    EXPECT_EQ(shard.Status().state_checksum(), before);
  }
  PushRound(shard, 2, {1, 0}, v1::GRADIENT_SPACE_PRECONDITIONED);
  EXPECT_EQ(shard.Status().current_step(), 3u);
}

TEST(Shard, DeepSpeedModeKeepsRawGradientsAfterTheFreeze) {
  const std::vector<float> x0 = InitialWeights(kN);
  ShardConfig config = OneBitAdamConfig(2, /*freeze_step=*/1);
  config.optimizer.preconditioned = false;
  config.optimizer.variance_floor = 0.0f;
  std::unique_ptr<Shard> shard = MakeRegisteredShard(config, x0);
  ASSERT_NE(shard, nullptr);
  PushRound(*shard, 0, {0, 1});
  EXPECT_EQ(shard->Status().stage(), v1::OPTIMIZER_STAGE_COMPRESSION);
  absl::StatusOr<v1::PushResponse> r = shard->Push(PushRequestFor(
      0, 1, Fp32Tensor(Gradient(kN, 0, 1)), v1::GRADIENT_SPACE_PRECONDITIONED));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  PushRound(*shard, 1, {0, 1}, v1::GRADIENT_SPACE_RAW);
  EXPECT_EQ(shard->Status().current_step(), 2u);
}

TEST(Shard, RegistrationChecksWorkerCountShardAndLayout) {
  const std::vector<float> x0 = InitialWeights(kN);
  absl::StatusOr<std::unique_ptr<Shard>> created =
      Shard::Create(ExactSgdConfig(2), nullptr);
  ASSERT_TRUE(created.ok());
  Shard& shard = **created;

  // Before registration nothing is accepted.
  absl::StatusOr<v1::PushResponse> push =
      shard.Push(PushRequestFor(0, 0, Fp32Tensor(Gradient(kN, 0, 0))));
  EXPECT_EQ(push.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(push.status().message()), HasSubstr("Register"));

  v1::RegisterRequest req = RegisterRequestFor(0, 3, x0);
  EXPECT_EQ(shard.Register(req).status().code(),
            absl::StatusCode::kFailedPrecondition);
  req = RegisterRequestFor(0, 2, x0);
  req.set_shard_index(1);
  req.set_num_shards(2);
  EXPECT_EQ(shard.Register(req).status().code(),
            absl::StatusCode::kFailedPrecondition);
  req = RegisterRequestFor(2, 2, x0);
  absl::StatusOr<v1::RegisterResponse> bad = shard.Register(req);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("worker_id"));
  req = RegisterRequestFor(0, 2, std::vector<float>(kN - 1, 0.0f));
  bad = shard.Register(req);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("initial_weights"));
  EXPECT_FALSE(shard.registered());

  absl::StatusOr<v1::RegisterResponse> ok =
      shard.Register(RegisterRequestFor(0, 2, x0));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->shard_begin(), 0u);
  EXPECT_EQ(ok->shard_end(), kN);
  EXPECT_EQ(ok->freeze_step(), 0u);  // sgd never freezes
  const uint64_t state = shard.Status().state_checksum();

  req = RegisterRequestFor(1, 2, x0);
  req.mutable_layout()->mutable_tensors(1)->set_shape(0, 128);
  bad = shard.Register(req);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("tensors[1] ('b').shape[0] is 128, expected 256"));
  EXPECT_EQ(shard.Status().workers_registered(), 1u);
  EXPECT_EQ(shard.Status().state_checksum(), state);

  // A later worker's initial weights are ignored.
  ok = shard.Register(RegisterRequestFor(1, 2, std::vector<float>(kN, 5.0f)));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_FALSE(ok->initialized_model());
  EXPECT_EQ(shard.Status().state_checksum(), state);
  EXPECT_EQ(shard.Status().workers_registered(), 2u);
}

}  // namespace
}  // namespace pserver
