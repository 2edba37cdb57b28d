// Client::InstallShardStates against real in-process shards on loopback,
// with other workers registering while worker 0 installs shard by shard
// (issue 47: resuming a script's optimizer.state_dict() into fresh shards).
#include <memory>
#include <optional>
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

// Worker 0's state_dict of step 3 in a job that went on to step 6 after
// worker 0's process died: two workers of Adam on two shards, worker 1
// (`survivor`) still registered.
struct JobThatWentOn {
  std::unique_ptr<Cluster> cluster;
  std::optional<std::unique_ptr<Client>> survivor;
  std::vector<ShardStateCopy> saved;
};

void StartJobThatWentOn(const v1::ModelLayout& layout, JobThatWentOn* job) {
  const uint64_t n = TotalElements(layout);
  job->cluster = StartCluster(2, 2, Adam(), v1::CODEC_FP32);
  ASSERT_NE(job->cluster, nullptr);
  auto a = Client::Connect(Options(*job->cluster, 0, v1::CODEC_FP32));
  auto b = Client::Connect(Options(*job->cluster, 1, v1::CODEC_FP32));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Register(layout, Values(n, 8)).ok());
  ASSERT_TRUE((*b)->Register(layout, Values(n, 8)).ok());
  for (uint64_t t = 0; t < 3; ++t) StepBoth(**a, **b, n, t);
  auto saved = (*a)->FetchShardStates();
  ASSERT_TRUE(saved.ok()) << saved.status();
  job->saved = *std::move(saved);
  for (uint64_t t = 3; t < 6; ++t) StepBoth(**a, **b, n, t);
  job->survivor = *std::move(b);
}

// Restarts shard 1 without a checkpoint and starts the survivor's step 6
// in a thread, whose push reinstalls shard 1 from its replica; returns the
// thread once shard 1 has a model (or after 10 s).
std::thread PushUntilShard1IsReinstalled(JobThatWentOn& job, uint64_t n,
                                         absl::Status* pushed) {
  EXPECT_TRUE(RestartShard(*job.cluster, 1));
  std::thread t([&job, n, pushed] {
    *pushed = (*job.survivor)->Step(Gradient(n, 1, 6));
  });
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!job.cluster->shard(1)->Status().model_registered() &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  return t;
}

// StartJobThatWentOn's job for each test, its parts by name.
class ClientInstallJobWentOn : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartJobThatWentOn(layout, &job));
  }
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  JobThatWentOn job;
  std::unique_ptr<Cluster>& cluster = job.cluster;
  std::optional<std::unique_ptr<Client>>& b = job.survivor;  // worker 1
  const std::vector<ShardStateCopy>* saved = &job.saved;     // of step 3
};

// What the language model's chaos run found: shard 1 restarted without a
// checkpoint and a live worker reinstalled it from its replica at the
// rounds' step; worker 0 restarted from a state_dict saved rounds before
// and was refused (shard 1 held a model but had completed no round since
// it started), so its supervisor restarted it into the same refusal and
// the job stopped. Both shards are the running job's: worker 0 keeps them
// (shards_ahead) and the rounds go on with every worker.
TEST_F(ClientInstallJobWentOn,
       AnOlderStateJoinsAShardReinstalledFromALiveReplica) {
  // Worker 1's next push finds shard 1 without a model and reinstalls it
  // from its replica; the round then waits for worker 0.
  absl::Status pushed;
  std::thread survivor = PushUntilShard1IsReinstalled(job, n, &pushed);
  const v1::GetStatusResponse reinstalled = cluster->shard(1)->Status();
  ASSERT_TRUE(reinstalled.model_registered());
  EXPECT_EQ(reinstalled.current_step(), 6u);
  EXPECT_FALSE(reinstalled.rounds_since_start());
  EXPECT_TRUE(reinstalled.skipped_since_start());
  EXPECT_FALSE(reinstalled.takes_state());

  auto restarted = Client::Connect(Options(*cluster, 0, v1::CODEC_FP32));
  ASSERT_TRUE(restarted.ok());
  ASSERT_TRUE((*restarted)->Register(layout, Values(n, 8)).ok());
  auto outcome = (*restarted)->InstallShardStates(*saved);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->shards_ahead);
  EXPECT_EQ(outcome->installed, 0);
  EXPECT_EQ((*restarted)->step(), 6u);
  const absl::Status own = (*restarted)->Step(Gradient(n, 0, 6));
  survivor.join();
  ASSERT_TRUE(own.ok()) << own;
  ASSERT_TRUE(pushed.ok()) << pushed;
  StepBoth(**restarted, **b, n, 7);
  EXPECT_EQ((*restarted)->step(), 8u);
  EXPECT_EQ((*b)->step(), 8u);
  EXPECT_TRUE(BitEqual((*restarted)->weights(), (*b)->weights()));
  for (uint32_t s = 0; s < 2; ++s) {
    EXPECT_EQ(cluster->shard(s)->Status().current_step(), 8u) << "shard " << s;
  }
}

// The language model's chaos run again, both shards this time: each
// restarted (one without a usable checkpoint, one from an older one) and
// skipped to the workers' step, and neither had completed a round when
// worker 0 restarted from an older state_dict.
// Both shards are the running job's; and a shard restored at the job's
// step (no round, no skip) beside them is too.
TEST_F(ClientInstallJobWentOn,
       AnOlderStateJoinsShardsThatSkippedToTheRounds) {
  // Shard 1 restarts without a checkpoint, and worker 1's next push
  // reinstalls it from its replica (a skip from step 0 to 6); then shard 0
  // restarts from its checkpoint of step 3, and a Register (worker 1's
  // retry or worker 0's) skips it to 6.
  absl::Status pushed;
  std::thread survivor = PushUntilShard1IsReinstalled(job, n, &pushed);
  ASSERT_TRUE(RestartShard(*cluster, 0));
  InstallInto(*cluster->shard(0), (*saved)[0]);
  auto restarted = Client::Connect(Options(*cluster, 0, v1::CODEC_FP32));
  ASSERT_TRUE(restarted.ok());
  const absl::Status joined = (*restarted)->Register(layout, Values(n, 8));
  ASSERT_TRUE(joined.ok()) << joined;
  for (uint32_t s = 0; s < 2; ++s) {
    const v1::GetStatusResponse st = cluster->shard(s)->Status();
    ASSERT_TRUE(st.model_registered()) << "shard " << s;
    EXPECT_EQ(st.current_step(), 6u) << "shard " << s;
    EXPECT_FALSE(st.rounds_since_start()) << "shard " << s;
    EXPECT_TRUE(st.skipped_since_start()) << "shard " << s;
  }
  auto outcome = (*restarted)->InstallShardStates(*saved);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->shards_ahead);
  const absl::Status own = (*restarted)->Step(Gradient(n, 0, 6));
  survivor.join();
  ASSERT_TRUE(own.ok()) << own;
  ASSERT_TRUE(pushed.ok()) << pushed;
  EXPECT_TRUE(BitEqual((*restarted)->weights(), (*b)->weights()));

  // Shard 1 restored at the job's step 7 (no round, no skip) beside shard
  // 0, which has completed rounds: kept too.
  auto at7 = (*restarted)->FetchShardStates();
  ASSERT_TRUE(at7.ok()) << at7.status();
  ASSERT_TRUE(RestartShard(*cluster, 1));
  InstallInto(*cluster->shard(1), (*at7)[1]);
  const v1::GetStatusResponse st1 = cluster->shard(1)->Status();
  EXPECT_FALSE(st1.rounds_since_start() || st1.skipped_since_start());
  restarted->reset();
  auto again = Client::Connect(Options(*cluster, 0, v1::CODEC_FP32));
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->Register(layout, Values(n, 8)).ok());
  auto kept = (*again)->InstallShardStates(*saved);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_TRUE(kept->shards_ahead);
  StepBoth(**again, **b, n, 7);
  EXPECT_EQ((*again)->step(), 8u);
  EXPECT_TRUE(BitEqual((*again)->weights(), (*b)->weights()));
}

// Without a shard past the state's step, one holding another step is a
// mismatch (shards restored from checkpoints the state_dict is not of):
// refused, naming the shard and both steps, and nothing changes.
TEST(ClientInstall, AStateOfAnotherStepIsRefusedWhenNoShardWentOn) {
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  const std::vector<ShardStateCopy> states = SavedStates(layout);
  ASSERT_EQ(states.size(), 2u);
  auto cluster = StartCluster(2, 2, Adam(), v1::CODEC_FP32);
  ASSERT_NE(cluster, nullptr);
  auto a = Client::Connect(Options(*cluster, 0, v1::CODEC_FP32));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*a)->Register(layout, Values(n, 8)).ok());
  InstallInto(*cluster->shard(0), states[0]);
  InstallInto(*cluster->shard(1), states[1]);
  std::vector<ShardStateCopy> older = states;
  for (ShardStateCopy& s : older) s.step = 2;
  auto outcome = (*a)->InstallShardStates(older);
  ASSERT_FALSE(outcome.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(outcome.status()));
  EXPECT_TRUE(absl::StrContains(
      outcome.status().message(),
      "shard 0/2 holds step 3; the state_dict is of step 2"))
      << outcome.status();
  for (uint32_t s = 0; s < 2; ++s) {
    EXPECT_EQ(cluster->shard(s)->Status().current_step(), 3u);
    EXPECT_EQ(cluster->shard(s)->Status().replica_checksum(),
              states[s].replica_checksum);
  }
}

}  // namespace
}  // namespace pserver
