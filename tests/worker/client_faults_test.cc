// Faults that overlap, as the chaos benchmark (tests/bench/chaos.sh) found
// them: each test replays one of its failures against real in-process
// shards on loopback, restarted for real, with a proxy
// (tests/worker/shard_proxy.h) where a fault must land at an exact moment.
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "common/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard_server.h"
#include "tests/test_util/temp_dir.h"
#include "tests/worker/client_test_util.h"
#include "tests/worker/shard_proxy.h"
#include "worker/client.h"

namespace pserver {
namespace {

using namespace testing_util;  // NOLINT: the shared test helpers

// Every shard's replica checksum matches the client's weights.
void ExpectInStepWithShards(Cluster& cluster, const Client& c, uint64_t n) {
  const uint32_t shards = cluster.config.num_shards;
  for (uint32_t s = 0; s < shards; ++s) {
    const ShardRange r = ShardRangeFor(n, shards, s);
    EXPECT_EQ(ChecksumOf(c.weights().subspan(r.begin, r.size())),
              cluster.shard(s)->Status().replica_checksum())
        << "shard " << s;
  }
}

void RestartFromNothing(Cluster& cluster, uint32_t s) {
  const int port = cluster.servers[s]->port();
  cluster.servers[s]->Shutdown(absl::ZeroDuration());
  cluster.servers[s].reset();
  auto restarted = StartShard(cluster.config, s, port, nullptr);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  cluster.servers[s] = std::move(restarted).value();
}

// Chaos fault `worker_stop`: a worker SIGSTOPped past its lease while its
// pull waited. The shards dropped it and went on; when it woke, its retried
// pull was answered with the rounds' step and it died with "shard 1
// answered with step 20; expected 1". It now rejoins every shard and takes
// the rounds' weights. Here the proxy fails its pulls to shard 1 (retried,
// never reaching the shard) while the other worker trains on.
TEST(ClientFaults, AWorkerStalledWithAPullInFlightRejoinsTheRounds) {
  auto cluster = StartLeasedCluster(2, 2, v1::CODEC_FP32);
  ASSERT_NE(cluster, nullptr);
  ShardProxy proxy(cluster->addresses[1]);
  ASSERT_NE(proxy.address(), "");
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  ClientOptions so = Options(*cluster, 0, v1::CODEC_FP32);
  so.server_addresses[1] = proxy.address();
  auto stalled = Client::Connect(so);
  auto busy = Client::Connect(Options(*cluster, 1, v1::CODEC_FP32));
  ASSERT_TRUE(stalled.ok() && busy.ok());
  ASSERT_TRUE((*stalled)->Register(layout, Values(n, 8)).ok());
  ASSERT_TRUE((*busy)->Register(layout, Values(n, 8)).ok());
  StepBoth(**stalled, **busy, n, 0);

  proxy.pull_failure = grpc::StatusCode::UNAVAILABLE;
  absl::Status st;
  std::thread worker([&] { st = (*stalled)->Step(Gradient(n, 0, 1)); });
  constexpr int kSteps = 20;
  for (int t = 1; t < kSteps; ++t) {
    absl::Status b = (*busy)->Step(Gradient(n, 1, t));
    ASSERT_TRUE(b.ok()) << "step " << t << ": " << b;
  }
  ASSERT_GT(proxy.pulls_failed.load(), 0);
  proxy.pull_failure = 0;
  worker.join();
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ((*stalled)->step(), static_cast<uint64_t>(kSteps));
  EXPECT_TRUE(BitEqual((*stalled)->weights(), (*busy)->weights()));
  EXPECT_GE((*stalled)->stats().rejoins, 2u);  // every shard
  ExpectInStepWithShards(*cluster, **stalled, n);
  // Both are counted again: the next rounds wait for both workers.
  StepBoth(**stalled, **busy, n, kSteps);
  EXPECT_EQ((*stalled)->step(), kSteps + 1u);
  EXPECT_TRUE(BitEqual((*stalled)->weights(), (*busy)->weights()));
  EXPECT_EQ(cluster->shard(0)->Status().workers_live(), 2u);
}

// Chaos (the language model): a worker stalled past its lease resumed while
// another worker's push had reached shard 1 and not yet shard 0. Its push was
// refused on both; it rejoined shard 0 at step k (counted at once: no push
// of round k there yet) and shard 1 at k + 1, pulled step k + 1 from both,
// and shard 0 refused that pull four times (this worker had not pushed step
// k there): "replica of shard 0 does not match its checksum even after a
// snapshot". Now a worker that finds a shard past its next step rejoins
// every shard and pulls the lagging shard's step, as at Register.
TEST(ClientFaults, AStalledWorkerRejoinsShardsThatAreAStepApart) {
  auto cluster = StartLeasedCluster(2, 2, v1::CODEC_FP32);
  ASSERT_NE(cluster, nullptr);
  ShardProxy proxy(cluster->addresses[0]);  // the busy worker's way to shard 0
  ASSERT_NE(proxy.address(), "");
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  ClientOptions bo = Options(*cluster, 1, v1::CODEC_FP32);
  bo.server_addresses[0] = proxy.address();
  auto stalled = Client::Connect(Options(*cluster, 0, v1::CODEC_FP32));
  auto busy = Client::Connect(bo);
  ASSERT_TRUE(stalled.ok() && busy.ok());
  ASSERT_TRUE((*stalled)->Register(layout, Values(n, 8)).ok());
  ASSERT_TRUE((*busy)->Register(layout, Values(n, 8)).ok());
  StepBoth(**stalled, **busy, n, 0);
  constexpr uint64_t kSteps = 10;
  for (uint64_t t = 1; t < kSteps; ++t) {
    absl::Status b = (*busy)->Step(Gradient(n, 1, t));
    ASSERT_TRUE(b.ok()) << "step " << t << ": " << b;
  }
  // The busy worker's push of step 10 reaches shard 1 and is held on its
  // way to shard 0.
  absl::Notification held, release;
  proxy.SetBeforePush([&] {
    if (!held.HasBeenNotified()) held.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(20));
  });
  absl::Status bs;
  std::thread other([&] { bs = (*busy)->Step(Gradient(n, 1, kSteps)); });
  ASSERT_TRUE(held.WaitForNotificationWithTimeout(absl::Seconds(10)));
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (cluster->shard(1)->Status().current_step() != kSteps + 1 &&
         absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(cluster->shard(1)->Status().current_step(), kSteps + 1);
  ASSERT_EQ(cluster->shard(0)->Status().current_step(), kSteps);

  absl::Status st = (*stalled)->Step(Gradient(n, 0, 1));
  proxy.SetBeforePush(nullptr);
  release.Notify();
  ASSERT_TRUE(st.ok()) << st;
  // At the lagging shard's step, shard 1's slice one step ahead.
  EXPECT_EQ((*stalled)->step(), kSteps);
  // Then both go on: the stalled worker's push of step 10 completes shard
  // 0's round (shard 1 acknowledges it as over), and both pull step 11.
  absl::Status ss = (*stalled)->Step(Gradient(n, 0, kSteps));
  other.join();
  ASSERT_TRUE(ss.ok()) << ss;
  ASSERT_TRUE(bs.ok()) << bs;
  EXPECT_EQ((*stalled)->step(), kSteps + 1);
  EXPECT_EQ((*busy)->step(), kSteps + 1);
  EXPECT_TRUE(BitEqual((*stalled)->weights(), (*busy)->weights()));
  ExpectInStepWithShards(*cluster, **stalled, n);
  StepBoth(**stalled, **busy, n, kSteps + 1);
  EXPECT_TRUE(BitEqual((*stalled)->weights(), (*busy)->weights()));
}

// Chaos fault `shard_kill` before the shard's first checkpoint, with a
// worker restarted meanwhile: the restarted worker found the shard empty,
// installed its initial weights there at step 0, and refused to start
// ("shards are more than one step apart: their steps range from 0 to 3");
// live workers then fast-forwarded the initial weights. Now the restarted
// worker waits while the live worker reinstalls the shard from its replica.
TEST(ClientFaults, ARestartedWorkerLeavesALostShardToAWorkerWithItsWeights) {
  auto cluster = StartCluster(2, 2, ExactSgd(), v1::CODEC_FP32);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  auto live = Client::Connect(Options(*cluster, 0, v1::CODEC_FP32));
  auto old = Client::Connect(Options(*cluster, 1, v1::CODEC_FP32));
  ASSERT_TRUE(live.ok() && old.ok());
  ASSERT_TRUE((*live)->Register(layout, Values(n, 8)).ok());
  ASSERT_TRUE((*old)->Register(layout, Values(n, 8)).ok());
  for (int t = 0; t < 3; ++t) StepBoth(**live, **old, n, t);
  const std::vector<float> before((*live)->weights().begin(),
                                  (*live)->weights().end());
  old->reset();  // worker 1's process dies...
  RestartFromNothing(*cluster, 1);  // ...and shard 1 with its state

  // Worker 1 restarts (fresh: initial weights only) and registers first.
  absl::Mutex mu;
  std::vector<std::string> lines;
  ClientOptions ro = Options(*cluster, 1, v1::CODEC_FP32);
  ro.log = [&](absl::string_view line) {
    absl::MutexLock l(&mu);
    lines.emplace_back(line);
  };
  auto restarted = Client::Connect(ro);
  ASSERT_TRUE(restarted.ok());
  absl::Status rs;
  const std::vector<float> g1 = Gradient(n, 1, 3);
  std::thread worker1([&] {
    rs = (*restarted)->Register(layout, Values(n, 8));
    if (rs.ok()) rs = (*restarted)->Step(g1);
  });
  auto waiting = [&] {
    absl::MutexLock l(&mu);
    for (const std::string& line : lines) {
      if (absl::StrContains(line, "has no model while shard 0")) return true;
    }
    return false;
  };
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (!waiting() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
  bool waited = waiting();
  if (!waited) {
    // Not waiting: Register went on (or failed); let it finish first.
    worker1.join();
  }
  ASSERT_TRUE(waited) << rs << "\n" << absl::StrJoin(lines, "\n");

  // The live worker's next push reinstalls shard 1 from its replica.
  const std::vector<float> g0 = Gradient(n, 0, 3);
  absl::Status ls = (*live)->Step(g0);
  worker1.join();
  ASSERT_TRUE(ls.ok()) << ls;
  ASSERT_TRUE(rs.ok()) << rs;
  EXPECT_EQ((*live)->step(), 4u);
  EXPECT_EQ((*restarted)->step(), 4u);
  // x4 = x3 - (g0 + g1) / 2 everywhere: no slice went back to the initial
  // weights.
  std::vector<float> expected(n);
  for (uint64_t i = 0; i < n; ++i) {
    expected[i] = before[i] - (g0[i] + g1[i]) * 0.5f;
  }
  EXPECT_TRUE(BitEqual((*live)->weights(), expected));
  EXPECT_TRUE(BitEqual((*restarted)->weights(), expected));
  ExpectInStepWithShards(*cluster, **live, n);
}

// Chaos: a shard restored from a checkpoint behind the rounds while every
// worker restarted too. Each restarted worker refused to start ("shards are
// more than one step apart: their steps range from 2 to 5"), and the
// supervisor restarted it, forever. Now Register has the lagging shard skip
// to the rounds' step (its lost rounds are lost, as with a live worker).
TEST(ClientFaults, RestartedWorkersBringAShardRestoredBehindToTheRounds) {
  const std::string dir = MakeTempDir("client_faults_ckpt");
  const std::string behind = MakeTempDir("client_faults_behind");
  ShardConfig config;
  config.num_shards = 2;
  config.num_workers = 1;
  config.optimizer = ExactSgd();
  config.pull_codec = v1::CODEC_FP32;
  config.checkpoint_dir = dir;
  auto cluster = StartClusterWith(config);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  {
    auto c = Client::Connect(Options(*cluster, 0, v1::CODEC_FP32));
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE((*c)->Register(layout, Values(n, 8)).ok());
    for (int t = 0; t < 2; ++t) ASSERT_TRUE((*c)->Step(Gradient(n, 0, t)).ok());
    ASSERT_TRUE(cluster->shard(1)->SaveCheckpoint().ok());
    std::filesystem::copy(dir, behind,
                          std::filesystem::copy_options::recursive |
                              std::filesystem::copy_options::overwrite_existing);
    for (int t = 2; t < 5; ++t) ASSERT_TRUE((*c)->Step(Gradient(n, 0, t)).ok());
  }  // the worker dies at step 5
  const int port = cluster->servers[1]->port();
  cluster->servers[1]->Shutdown(absl::ZeroDuration());
  cluster->servers[1].reset();
  ShardConfig from_behind = config;
  from_behind.checkpoint_dir = behind;
  auto restored = StartShard(from_behind, 1, port, nullptr);
  ASSERT_TRUE(restored.ok()) << restored.status();
  cluster->servers[1] = std::move(restored).value();
  ASSERT_EQ(cluster->shard(1)->Status().current_step(), 2u);

  auto c = Client::Connect(Options(*cluster, 0, v1::CODEC_FP32));
  ASSERT_TRUE(c.ok());
  absl::Status st = (*c)->Register(layout, Values(n, 8));
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ((*c)->step(), 5u);
  EXPECT_EQ(cluster->shard(1)->Status().current_step(), 5u);
  ExpectInStepWithShards(*cluster, **c, n);
  ASSERT_TRUE((*c)->Step(Gradient(n, 0, 5)).ok());
  EXPECT_EQ((*c)->step(), 6u);
  ExpectInStepWithShards(*cluster, **c, n);
}

// Chaos: a shard killed, restarted from nothing, and killed again while a
// worker was resending its push after rejoining: the resend was refused
// ("worker_id 3 has not registered; call Register first") and the worker
// died. Now a refusal of the resend that registering again fixes is
// recovered again. The proxy restarts shard 1 just before the resend.
TEST(ClientFaults, AShardKilledAgainDuringTheResendIsRecoveredAgain) {
  auto cluster = StartCluster(2, 1, ExactSgd(), v1::CODEC_FP32);
  ASSERT_NE(cluster, nullptr);
  ShardProxy proxy(cluster->addresses[1]);
  ASSERT_NE(proxy.address(), "");
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  ClientOptions o = Options(*cluster, 0, v1::CODEC_FP32);
  o.server_addresses[1] = proxy.address();
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Register(layout, Values(n, 8)).ok());
  for (int t = 0; t < 2; ++t) ASSERT_TRUE((*c)->Step(Gradient(n, 0, t)).ok());
  const std::vector<float> before((*c)->weights().begin(),
                                  (*c)->weights().end());

  RestartFromNothing(*cluster, 1);
  // Push 1: refused (NOT_REGISTERED), the client rejoins. Push 2, the
  // resend: the shard is restarted from nothing once more just before it.
  int pushes = 0;
  proxy.SetBeforePush([&] {
    if (++pushes == 2) RestartFromNothing(*cluster, 1);
  });
  const std::vector<float> g = Gradient(n, 0, 2);
  absl::Status st = (*c)->Step(g);
  proxy.SetBeforePush(nullptr);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_GE(pushes, 3);
  EXPECT_EQ((*c)->stats().rejoins, 2u);
  EXPECT_EQ((*c)->step(), 3u);
  std::vector<float> expected(n);
  for (uint64_t i = 0; i < n; ++i) expected[i] = before[i] - g[i];
  EXPECT_TRUE(BitEqual((*c)->weights(), expected));
  ExpectInStepWithShards(*cluster, **c, n);
}

}  // namespace
}  // namespace pserver
