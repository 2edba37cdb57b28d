// Client::InstallShardStates against real in-process shards on loopback,
// with other workers registering while worker 0 installs shard by shard
// (issue 47: resuming a script's optimizer.state_dict() into fresh shards).
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/chunking.h"
#include "common/layout.h"
#include "gtest/gtest.h"
#include "tests/worker/client_test_util.h"
#include "worker/client.h"

namespace pserver {
namespace {

using namespace testing_util;  // NOLINT: the shared test helpers

OptimizerConfig Adam() {
  OptimizerConfig o;
  o.kind = OptimizerKind::kAdam;
  o.lr = 0.01f;
  return o;
}

// Two workers train 3 rounds of Adam on two shards; worker 0's
// FetchShardStates, as its state_dict() would hold them.
std::vector<ShardStateCopy> SavedStates(const v1::ModelLayout& layout) {
  auto source = StartCluster(2, 2, Adam(), v1::CODEC_FP32);
  EXPECT_NE(source, nullptr);
  if (source == nullptr) return {};
  const uint64_t n = TotalElements(layout);
  auto a = Client::Connect(Options(*source, 0, v1::CODEC_FP32));
  auto b = Client::Connect(Options(*source, 1, v1::CODEC_FP32));
  EXPECT_TRUE(a.ok() && b.ok());
  if (!a.ok() || !b.ok()) return {};
  EXPECT_TRUE((*a)->Register(layout, Values(n, 8)).ok());
  EXPECT_TRUE((*b)->Register(layout, Values(n, 8)).ok());
  for (uint64_t t = 0; t < 3; ++t) StepBoth(**a, **b, n, t);
  auto states = (*a)->FetchShardStates();
  EXPECT_TRUE(states.ok()) << states.status();
  return states.ok() ? *states : std::vector<ShardStateCopy>{};
}

// InstallShardState of `state` into `shard` in chunks, as worker 0.
void InstallInto(Shard& shard, const ShardStateCopy& state) {
  const uint64_t k = kShardStateChunkBytes;
  for (uint64_t c = 0; c * k < state.bytes.size(); ++c) {
    v1::InstallShardStateRequest req;
    req.set_worker_id(0);
    req.set_chunk(static_cast<uint32_t>(c));
    req.set_total_bytes(state.bytes.size());
    req.set_step(state.step);
    req.set_replica_checksum(state.replica_checksum);
    req.set_data(state.bytes.substr(c * k, k));
    auto r = shard.InstallShardState(req);
    ASSERT_TRUE(r.ok()) << r.status();
    if (r->installed()) return;
  }
  FAIL() << "the shard took every chunk and did not install the state";
}

// The race the nanoGPT resume benchmark found (1 of 30 resumes): worker 1
// registered while worker 0 had installed shard 1 and not yet shard 0.
// Worker 1 then asked shard 0, at step 0 with initial weights, to skip to
// the state's step, and the state of shard 0 was never installed, without
// a word. A shard at step 0 is now waited for.
TEST(ClientInstall, AWorkerRegisteringMidInstallationWaitsForEveryShard) {
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  const std::vector<ShardStateCopy> states = SavedStates(layout);
  ASSERT_EQ(states.size(), 2u);
  ASSERT_EQ(states[0].step, 3u);

  auto fresh = StartCluster(2, 2, Adam(), v1::CODEC_FP32);
  ASSERT_NE(fresh, nullptr);
  auto installer = Client::Connect(Options(*fresh, 0, v1::CODEC_FP32));
  ASSERT_TRUE(installer.ok());
  ASSERT_TRUE((*installer)->Register(layout, Values(n, 8)).ok());
  InstallInto(*fresh->shard(1), states[1]);  // shard 0 is next

  auto late = Client::Connect(Options(*fresh, 1, v1::CODEC_FP32));
  ASSERT_TRUE(late.ok());
  absl::Status registered;
  absl::Notification done;
  std::thread t([&] {
    registered = (*late)->Register(layout, Values(n, 8));
    done.Notify();
  });
  // However long it is given, the late worker neither returns nor moves
  // shard 0 while shard 0 waits for its state.
  const bool returned = done.WaitForNotificationWithTimeout(absl::Seconds(1));
  EXPECT_FALSE(returned) << registered;
  EXPECT_EQ(fresh->shard(0)->Status().current_step(), 0u);
  // What the shards announce for InstallShardStates to decide by.
  EXPECT_TRUE(fresh->shard(0)->Status().takes_state());
  EXPECT_FALSE(fresh->shard(1)->Status().takes_state());
  InstallInto(*fresh->shard(0), states[0]);
  t.join();
  ASSERT_TRUE(registered.ok()) << registered;
  EXPECT_EQ((*late)->step(), 3u);
  for (uint32_t s = 0; s < 2; ++s) {
    EXPECT_EQ(fresh->shard(s)->Status().current_step(), 3u) << "shard " << s;
    EXPECT_EQ(fresh->shard(s)->Status().replica_checksum(),
              states[s].replica_checksum)
        << "shard " << s;
  }
}

// When no state reaches the shard at step 0 (its installer died), Register
// fails after retry_budget, naming the shard and what it waited for, and
// leaves the shard at step 0.
TEST(ClientInstall, AShardLeftAtStepZeroFailsRegisterAfterTheRetryBudget) {
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  const std::vector<ShardStateCopy> states = SavedStates(layout);
  ASSERT_EQ(states.size(), 2u);
  auto fresh = StartCluster(2, 2, Adam(), v1::CODEC_FP32);
  ASSERT_NE(fresh, nullptr);
  auto installer = Client::Connect(Options(*fresh, 0, v1::CODEC_FP32));
  ASSERT_TRUE(installer.ok());
  ASSERT_TRUE((*installer)->Register(layout, Values(n, 8)).ok());
  InstallInto(*fresh->shard(1), states[1]);

  ClientOptions o = Options(*fresh, 1, v1::CODEC_FP32);
  o.retry_budget = absl::Seconds(1);
  auto late = Client::Connect(o);
  ASSERT_TRUE(late.ok());
  const absl::Status st = (*late)->Register(layout, Values(n, 8));
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_TRUE(absl::StrContains(
      st.message(), absl::StrCat("shard 0 (", fresh->addresses[0],
                                 ") is at step 0 and another at step 3; "
                                 "expected a saved state being installed")))
      << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "; still so after 1s"))
      << st;
  EXPECT_EQ(fresh->shard(0)->Status().current_step(), 0u);
}

}  // namespace
}  // namespace pserver
