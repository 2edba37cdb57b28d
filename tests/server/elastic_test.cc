// Workers that come and go (issue 48): slots beyond --initial_workers start
// absent, so the rounds do not wait for them; a worker that registers in
// one joins from the next round; Leave takes a worker out at once (the
// round it held up completes on the spot) and is not counted as a drop;
// Register brings it back. x_{t+1} = x_t - mean(g) over the workers that
// pushed (testing_util::ExactSgdConfig), no lease timeout: nothing here
// depends on time.
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
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

std::vector<float> Const(float v) { return std::vector<float>(kSmallElements, v); }

// Room for `slots` workers, `initial` of them in the job from the start.
std::unique_ptr<Shard> MakeShard(uint32_t slots, uint32_t initial) {
  ShardConfig c = testing_util::ExactSgdConfig(slots);
  c.initial_workers = initial;
  auto shard = Shard::Create(c, nullptr);
  EXPECT_TRUE(shard.ok()) << shard.status();
  return shard.ok() ? *std::move(shard) : nullptr;
}

absl::Status Push(Shard& s, uint32_t w, uint64_t step, float g) {
  return s.Push(PushRequestFor(w, step, Fp32Tensor(Const(g)))).status();
}

float Weight0(Shard& s) {
  auto r = s.PullBlocking(
      PullRequestFor(0, s.Status().current_step(), -1, 0, true),
      absl::Seconds(5));
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? DecodeAll(r->weights())[0] : -1.0f;
}

v1::LeaveRequest LeaveOf(uint32_t w) {
  v1::LeaveRequest r;
  r.set_worker_id(w);
  return r;
}

TEST(Elastic, TheRoundsWaitOnlyForTheInitialWorkersAndAJoinerCountsNext) {
  auto shard = MakeShard(4, 2);
  ASSERT_NE(shard, nullptr);
  Shard& s = *shard;
  for (uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(s.Register(RegisterRequestFor(w, 4, Const(10.0f))).ok());
  }
  EXPECT_EQ(s.Status().workers_live(), 2u);
  EXPECT_EQ(s.Status().initial_workers(), 2u);
  // Step 0: the two initial workers make the round; slots 2 and 3 are empty.
  ASSERT_TRUE(Push(s, 0, 0, 1.0f).ok());
  ASSERT_TRUE(Push(s, 1, 0, 3.0f).ok());
  EXPECT_EQ(s.Status().current_step(), 1u);
  EXPECT_EQ(Weight0(s), 8.0f);  // 10 - mean(1, 3)
  // Step 1: worker 0 is in when worker 3 joins: it counts from step 2, and
  // its push for step 1 is refused, naming that step.
  ASSERT_TRUE(Push(s, 0, 1, 2.0f).ok());
  auto joined = s.Register(RegisterRequestFor(3, 4, Const(0.0f)));
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->current_step(), 1u);
  EXPECT_FALSE(joined->initialized_model());
  absl::Status early = Push(s, 3, 1, 100.0f);
  EXPECT_EQ(early.code(), absl::StatusCode::kAborted) << early;
  EXPECT_NE(early.message().find("from step 2"), std::string::npos) << early;
  ASSERT_TRUE(Push(s, 1, 1, 4.0f).ok());
  EXPECT_EQ(s.Status().current_step(), 2u);
  EXPECT_EQ(Weight0(s), 5.0f);  // 8 - mean(2, 4)
  EXPECT_EQ(s.Status().workers_live(), 3u);
  EXPECT_EQ(s.Status().workers_joined(), 1u);
  // The joiner pulls the weights of the step it joins at.
  auto pulled = s.PullBlocking(PullRequestFor(3, 2, -1, 0, true),
                               absl::Seconds(5));
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(DecodeAll(pulled->weights())[0], 5.0f);
  // Step 2 waits for all three, and the mean is over three.
  ASSERT_TRUE(Push(s, 0, 2, 1.0f).ok());
  ASSERT_TRUE(Push(s, 1, 2, 2.0f).ok());
  EXPECT_EQ(s.Status().current_step(), 2u);
  ASSERT_TRUE(Push(s, 3, 2, 6.0f).ok());
  EXPECT_EQ(s.Status().current_step(), 3u);
  EXPECT_EQ(Weight0(s), 2.0f);  // 5 - mean(1, 2, 6)
}

TEST(Elastic, LeaveCompletesTheRoundItHeldUpAndIsNotADrop) {
  auto shard = MakeShard(3, 0);
  ASSERT_NE(shard, nullptr);
  Shard& s = *shard;
  for (uint32_t w = 0; w < 3; ++w) {
    ASSERT_TRUE(s.Register(RegisterRequestFor(w, 3, Const(10.0f))).ok());
  }
  EXPECT_EQ(s.Status().workers_registered(), 3u);
  ASSERT_TRUE(Push(s, 0, 0, 1.0f).ok());
  ASSERT_TRUE(Push(s, 1, 0, 3.0f).ok());
  EXPECT_EQ(s.Status().current_step(), 0u);  // waits for worker 2
  auto left = s.Leave(LeaveOf(2));
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_TRUE(left->was_live());
  EXPECT_EQ(left->current_step(), 0u);
  // The round went on at once, over the two that pushed.
  EXPECT_EQ(s.Status().current_step(), 1u);
  EXPECT_EQ(Weight0(s), 8.0f);
  v1::GetStatusResponse st = s.Status();
  EXPECT_EQ(st.workers_live(), 2u);
  // Not registered any more: live == registered, so PserverWorkerDropped
  // (live < registered) does not fire on a planned leave.
  EXPECT_EQ(st.workers_registered(), 2u);
  EXPECT_EQ(st.workers_left(), 1u);
  // Idempotent.
  auto again = s.Leave(LeaveOf(2));
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->was_live());
  EXPECT_EQ(s.Status().workers_left(), 1u);
  // A push after leaving is refused as from a worker that left.
  absl::Status after = Push(s, 2, 1, 100.0f);
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition) << after;
  EXPECT_NE(after.message().find("left the rounds"), std::string::npos)
      << after;
  ASSERT_TRUE(Push(s, 0, 1, 2.0f).ok());
  ASSERT_TRUE(Push(s, 1, 1, 4.0f).ok());
  EXPECT_EQ(Weight0(s), 5.0f);
  // Register brings it back between rounds: the next round waits for it.
  ASSERT_TRUE(s.Register(RegisterRequestFor(2, 3, Const(0.0f))).ok());
  EXPECT_EQ(s.Status().workers_live(), 3u);
  EXPECT_EQ(s.Status().workers_joined(), 0u);  // a return, not a join
  ASSERT_TRUE(Push(s, 0, 2, 1.0f).ok());
  ASSERT_TRUE(Push(s, 1, 2, 1.0f).ok());
  EXPECT_EQ(s.Status().current_step(), 2u);
  ASSERT_TRUE(Push(s, 2, 2, 4.0f).ok());
  EXPECT_EQ(Weight0(s), 3.0f);  // 5 - mean(1, 1, 4)
}

TEST(Elastic, APushMadeBeforeLeavingStillCounts) {
  auto shard = MakeShard(2, 0);
  ASSERT_NE(shard, nullptr);
  Shard& s = *shard;
  for (uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(s.Register(RegisterRequestFor(w, 2, Const(10.0f))).ok());
  }
  ASSERT_TRUE(Push(s, 1, 0, 4.0f).ok());
  ASSERT_TRUE(s.Leave(LeaveOf(1)).ok());
  EXPECT_EQ(s.Status().current_step(), 0u);  // worker 0 is still to push
  ASSERT_TRUE(Push(s, 0, 0, 2.0f).ok());
  EXPECT_EQ(Weight0(s), 7.0f);  // 10 - mean(2, 4)
  // The next round is worker 0's alone.
  ASSERT_TRUE(Push(s, 0, 1, 1.0f).ok());
  EXPECT_EQ(Weight0(s), 6.0f);
}

TEST(Elastic, ALeaveOfAWorkerNotInTheJobChangesNothing) {
  auto shard = MakeShard(3, 2);
  ASSERT_NE(shard, nullptr);
  Shard& s = *shard;
  for (uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(s.Register(RegisterRequestFor(w, 3, Const(1.0f))).ok());
  }
  // Slot 2 never joined: not live, not registered, not "left".
  auto absent = s.Leave(LeaveOf(2));
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_FALSE(absent->was_live());
  v1::GetStatusResponse st = s.Status();
  EXPECT_EQ(st.workers_left(), 0u);
  EXPECT_EQ(st.workers_registered(), 2u);
  EXPECT_EQ(st.workers_live(), 2u);
  // It can still join later, as a join (not a return).
  ASSERT_TRUE(s.Register(RegisterRequestFor(2, 3, Const(0.0f))).ok());
  EXPECT_EQ(s.Status().workers_joined(), 1u);
}

TEST(Elastic, BadLeavesAndConfigsAreRefusedAndChangeNothing) {
  auto shard = MakeShard(2, 0);
  ASSERT_NE(shard, nullptr);
  Shard& s = *shard;
  for (uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(s.Register(RegisterRequestFor(w, 2, Const(1.0f))).ok());
  }
  const uint64_t before = s.StateChecksum();
  auto unknown = s.Leave(LeaveOf(2));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("worker_id is 2; expected 0..1"),
            std::string::npos)
      << unknown.status();
  EXPECT_EQ(s.StateChecksum(), before);
  EXPECT_EQ(s.Status().workers_live(), 2u);
  // More initial workers than slots.
  ShardConfig c = testing_util::ExactSgdConfig(2);
  c.initial_workers = 3;
  auto bad = Shard::Create(c, nullptr);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("initial_workers is 3; expected 0..2"),
            std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace pserver
