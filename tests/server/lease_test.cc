// Worker leases: a worker that stops calling is dropped from the rounds so
// the others go on; the mean is then over the workers that contributed; a
// dropped worker rejoins through Register and counts again from the next
// round.
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/shard.h"
#include "tests/server/server_test_util.h"

namespace pserver {
namespace {

using testing_util::DecodeAll;
using testing_util::Fp32Tensor;
using testing_util::kSmallElements;
using testing_util::PullRequestFor;
using testing_util::PushRequestFor;
using testing_util::RegisterRequestFor;

// SGD with lr 1 and no momentum: x_{t+1} = x_t - mean(g), easy to check.
ShardConfig Config(uint32_t workers) {
  ShardConfig c;
  c.num_workers = workers;
  c.optimizer.kind = OptimizerKind::kSgd;
  c.optimizer.lr = 1.0f;
  c.optimizer.momentum = 0.0f;
  c.pull_codec = v1::CODEC_FP32;
  c.lease_timeout = absl::Milliseconds(300);
  return c;
}

std::vector<float> Const(float v) { return std::vector<float>(kSmallElements, v); }

std::vector<float> Weights(Shard& s) {
  auto r = s.PullBlocking(PullRequestFor(0, s.Status().current_step(), -1, 0, true),
                          absl::Seconds(5));
  EXPECT_TRUE(r.ok()) << r.status();
  return DecodeAll(r->weights());
}

TEST(Lease, SilentWorkerIsDroppedAndTheMeanIsOverContributors) {
  auto shard = Shard::Create(Config(3), nullptr);
  ASSERT_TRUE(shard.ok());
  Shard& s = **shard;
  for (uint32_t w = 0; w < 3; ++w) {
    ASSERT_TRUE(s.Register(RegisterRequestFor(w, 3, Const(10.0f))).ok());
  }
  // Step 0 with everyone: mean of 1, 2, 3 = 2.
  for (uint32_t w = 0; w < 3; ++w) {
    ASSERT_TRUE(s.Push(PushRequestFor(w, 0, Fp32Tensor(Const(w + 1.0f)))).ok());
  }
  // Worker 2's lease runs from its last call, just now.
  absl::Time start = absl::Now();
  EXPECT_EQ(Weights(s)[0], 8.0f);
  // Step 1: worker 2 is silent. Workers 0 and 1 push and wait in Pull for
  // longer than the lease: they are not dropped, worker 2 is.
  ASSERT_TRUE(s.Push(PushRequestFor(0, 1, Fp32Tensor(Const(1.0f)))).ok());
  ASSERT_TRUE(s.Push(PushRequestFor(1, 1, Fp32Tensor(Const(3.0f)))).ok());
  auto pulled = s.PullBlocking(PullRequestFor(0, 2, 1, 0, true), absl::Seconds(10));
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  EXPECT_EQ(DecodeAll(pulled->weights())[0], 6.0f);  // 8 - mean(1, 3)
  EXPECT_EQ(s.Status().workers_live(), 2u);
  // Its late push for the round that went on without it is refused.
  auto late = s.Push(PushRequestFor(2, 1, Fp32Tensor(Const(100.0f))));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kAborted) << late.status();
  // Step 2: worker 0 pushes, then worker 2 rejoins mid-round: it is counted
  // from step 3, so its push for 2 is refused and round 2 ends without it.
  ASSERT_TRUE(s.Push(PushRequestFor(0, 2, Fp32Tensor(Const(2.0f)))).ok());
  ASSERT_TRUE(s.Register(RegisterRequestFor(2, 3, Const(0.0f))).ok());
  auto early = s.Push(PushRequestFor(2, 2, Fp32Tensor(Const(100.0f))));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(early.status().message().find("from step 3"), std::string::npos)
      << early.status();
  ASSERT_TRUE(s.Push(PushRequestFor(1, 2, Fp32Tensor(Const(4.0f)))).ok());
  EXPECT_EQ(Weights(s)[0], 3.0f);  // 6 - mean(2, 4)
  EXPECT_EQ(s.Status().workers_live(), 3u);
  // Step 3 waits for all three again.
  ASSERT_TRUE(s.Push(PushRequestFor(0, 3, Fp32Tensor(Const(1.0f)))).ok());
  ASSERT_TRUE(s.Push(PushRequestFor(1, 3, Fp32Tensor(Const(1.0f)))).ok());
  EXPECT_EQ(s.Status().current_step(), 3u);
  ASSERT_TRUE(s.Push(PushRequestFor(2, 3, Fp32Tensor(Const(4.0f)))).ok());
  EXPECT_EQ(s.Status().current_step(), 4u);
  EXPECT_EQ(Weights(s)[0], 1.0f);  // 3 - mean(1, 1, 4)
}

TEST(Lease, NoTimeoutMeansTheRoundWaitsForever) {
  ShardConfig c = Config(2);
  c.lease_timeout = absl::ZeroDuration();
  auto shard = Shard::Create(c, nullptr);
  ASSERT_TRUE(shard.ok());
  Shard& s = **shard;
  for (uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(s.Register(RegisterRequestFor(w, 2, Const(1.0f))).ok());
  }
  ASSERT_TRUE(s.Push(PushRequestFor(0, 0, Fp32Tensor(Const(1.0f)))).ok());
  auto r = s.PullBlocking(PullRequestFor(0, 1, 0, 0), absl::Milliseconds(700));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.Status().workers_live(), 2u);
}

}  // namespace
}  // namespace pserver
