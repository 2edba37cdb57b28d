// Worker leases: a worker that stops calling is dropped from the rounds so
// the others go on; the mean is then over the workers that contributed; a
// dropped worker rejoins through Register and counts again from the next
// round. Time is a FakeClock and the tests reap leases with CheckLeases():
// nothing sleeps on the real clock.
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
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

constexpr absl::Duration kLease = absl::Milliseconds(300);

// x_{t+1} = x_t - mean(g) (testing_util::ExactSgdConfig), with leases.
ShardConfig Config(uint32_t workers) {
  ShardConfig c = testing_util::ExactSgdConfig(workers);
  c.lease_timeout = kLease;
  return c;
}

std::unique_ptr<Shard> MakeShard(const ShardConfig& c, const Clock* clock) {
  ShardEnv env;
  env.clock = clock;
  auto shard = Shard::Create(c, env);
  EXPECT_TRUE(shard.ok()) << shard.status();
  return shard.ok() ? *std::move(shard) : nullptr;
}

// A pull answered through its callback (by CheckLeases on this thread, or by
// the shard's own reaper thread, which also reads the fake clock).
class PendingPull {
 public:
  PendingPull(Shard& s, const v1::PullRequest& req)
      : id_(s.Pull(req, [this](absl::Status st, PullAnswer a) {
          absl::MutexLock l(&mu_);
          status_ = std::move(st);
          answer_ = std::move(a);
          done_ = true;
        })) {}
  uint64_t id() const { return id_; }
  bool done() {
    absl::MutexLock l(&mu_);
    return done_;
  }
  // Waits for the answer (a callback on another thread may be on its way);
  // false if none came within a generous real-time bound.
  bool Wait() {
    absl::MutexLock l(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(30));
  }
  absl::Status status() {
    absl::MutexLock l(&mu_);
    return status_;
  }
  std::vector<float> weights() {
    absl::MutexLock l(&mu_);
    return answer_ ? DecodeAll(answer_->Parse().weights()) : std::vector<float>();
  }

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  PullAnswer answer_ ABSL_GUARDED_BY(mu_);
  const uint64_t id_;  // after the fields the callback writes
};

std::vector<float> Const(float v) { return std::vector<float>(kSmallElements, v); }

std::vector<float> Weights(Shard& s) {
  auto r = s.PullBlocking(PullRequestFor(0, s.Status().current_step(), -1, 0, true),
                          absl::Seconds(5));
  EXPECT_TRUE(r.ok()) << r.status();
  return DecodeAll(r->weights());
}

TEST(Lease, SilentWorkerIsDroppedAndTheMeanIsOverContributors) {
  FakeClock clock;
  auto shard = MakeShard(Config(3), &clock);
  ASSERT_NE(shard, nullptr);
  Shard& s = *shard;
  for (uint32_t w = 0; w < 3; ++w) {
    ASSERT_TRUE(s.Register(RegisterRequestFor(w, 3, Const(10.0f))).ok());
  }
  // Step 0 with everyone: mean of 1, 2, 3 = 2.
  for (uint32_t w = 0; w < 3; ++w) {
    ASSERT_TRUE(s.Push(PushRequestFor(w, 0, Fp32Tensor(Const(w + 1.0f)))).ok());
  }
  // Worker 2's lease runs from its last call, now.
  EXPECT_EQ(Weights(s)[0], 8.0f);
  // Step 1: worker 2 is silent. Workers 0 and 1 push and wait in Pull for
  // longer than the lease: they are not dropped, worker 2 is.
  ASSERT_TRUE(s.Push(PushRequestFor(0, 1, Fp32Tensor(Const(1.0f)))).ok());
  ASSERT_TRUE(s.Push(PushRequestFor(1, 1, Fp32Tensor(Const(3.0f)))).ok());
  PendingPull pull(s, PullRequestFor(0, 2, 1, 0, true));
  ASSERT_NE(pull.id(), 0u);  // waiting for round 1
  clock.Advance(kLease);     // exactly the lease: not expired
  s.CheckLeases();
  EXPECT_FALSE(pull.done());
  EXPECT_EQ(s.Status().workers_live(), 3u);
  clock.Advance(absl::Milliseconds(1));
  s.CheckLeases();
  ASSERT_TRUE(pull.Wait());
  ASSERT_TRUE(pull.status().ok()) << pull.status();
  EXPECT_EQ(pull.weights()[0], 6.0f);  // 8 - mean(1, 3)
  EXPECT_EQ(s.Status().workers_live(), 2u);
  EXPECT_EQ(s.Status().current_step(), 2u);
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
  // Step 3 waits for all three again, however long worker 2 takes while
  // nobody reaps (its rejoin started its lease at the end of round 2).
  ASSERT_TRUE(s.Push(PushRequestFor(0, 3, Fp32Tensor(Const(1.0f)))).ok());
  ASSERT_TRUE(s.Push(PushRequestFor(1, 3, Fp32Tensor(Const(1.0f)))).ok());
  clock.Advance(kLease);
  s.CheckLeases();
  EXPECT_EQ(s.Status().current_step(), 3u);
  EXPECT_EQ(s.Status().workers_live(), 3u);
  ASSERT_TRUE(s.Push(PushRequestFor(2, 3, Fp32Tensor(Const(4.0f)))).ok());
  EXPECT_EQ(s.Status().current_step(), 4u);
  EXPECT_EQ(Weights(s)[0], 1.0f);  // 3 - mean(1, 1, 4)
}

TEST(Lease, AnyCallRenewsTheLease) {
  FakeClock clock;
  auto shard = MakeShard(Config(2), &clock);
  ASSERT_NE(shard, nullptr);
  Shard& s = *shard;
  for (uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(s.Register(RegisterRequestFor(w, 2, Const(5.0f))).ok());
  }
  ASSERT_TRUE(s.Push(PushRequestFor(0, 0, Fp32Tensor(Const(1.0f)))).ok());
  // Worker 1 has not pushed but pulls the current weights: that renews it.
  clock.Advance(absl::Milliseconds(200));
  ASSERT_TRUE(s.PullBlocking(PullRequestFor(1, 0, -1, 0, true), absl::Seconds(30))
                  .ok());
  clock.Advance(absl::Milliseconds(200));  // 400 ms since Register
  s.CheckLeases();
  EXPECT_EQ(s.Status().workers_live(), 2u);
  EXPECT_EQ(s.Status().current_step(), 0u);
  clock.Advance(absl::Milliseconds(101));  // 301 ms since its pull
  s.CheckLeases();
  EXPECT_EQ(s.Status().workers_live(), 1u);
  // The round went on with worker 0 alone.
  EXPECT_EQ(s.Status().current_step(), 1u);
  EXPECT_EQ(Weights(s)[0], 4.0f);
  // Worker 1 is told to register again.
  auto dropped = s.Push(PushRequestFor(1, 1, Fp32Tensor(Const(1.0f))));
  EXPECT_EQ(dropped.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(dropped.status().message().find("Register"), std::string::npos)
      << dropped.status();
}

TEST(Lease, NoTimeoutMeansTheRoundWaitsForever) {
  FakeClock clock;
  ShardConfig c = Config(2);
  c.lease_timeout = absl::ZeroDuration();
  auto shard = MakeShard(c, &clock);
  ASSERT_NE(shard, nullptr);
  Shard& s = *shard;
  for (uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(s.Register(RegisterRequestFor(w, 2, Const(1.0f))).ok());
  }
  ASSERT_TRUE(s.Push(PushRequestFor(0, 0, Fp32Tensor(Const(1.0f)))).ok());
  PendingPull pull(s, PullRequestFor(0, 1, 0, 0));
  ASSERT_NE(pull.id(), 0u);
  clock.Advance(absl::Hours(24 * 365));
  s.CheckLeases();
  EXPECT_FALSE(pull.done());
  EXPECT_EQ(s.Status().workers_live(), 2u);
  EXPECT_EQ(s.Status().current_step(), 0u);
  s.CancelPull(pull.id(), absl::DeadlineExceededError("test deadline"));
  ASSERT_TRUE(pull.Wait());
  EXPECT_EQ(pull.status().code(), absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace pserver
