// The client library (worker/client.h) against real in-process ShardServers
// on loopback, through real gRPC channels: splitting a flat gradient by shard
// and merging the pulled slices, the replica (deltas, snapshots, checksums),
// 1-bit Adam's switch to preconditioned pushes, error paths and retries, and
// byte accounting against the servers' own metrics.
#include "worker/client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "common/layout.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/shard_server.h"
#include "tests/worker/client_test_util.h"

namespace pserver {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using namespace testing_util;  // NOLINT: the shared test helpers

// --- Splitting and merging ------------------------------------------------

struct SplitCase {
  uint32_t shards;
  uint32_t workers;
};

class ClientSplitMerge : public ::testing::TestWithParam<SplitCase> {};

// With fp32 both ways and x_{t+1} = x_t - mean(g), every worker's replica
// after every step equals the mean of all workers' gradients subtracted from
// the previous weights, bit for bit, whatever the shard boundaries.
TEST_P(ClientSplitMerge, Fp32SgdReplicaIsExactlyXMinusMeanGradient) {
  const SplitCase p = GetParam();
  constexpr int kSteps = 4;
  auto cluster = StartCluster(p.shards, p.workers, ExactSgd(), v1::CODEC_FP32);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  ASSERT_NE(n % kShardAlignment, 0u);
  if (p.shards > 1) {
    // Tensor "b" [300, 817) straddles the first shard boundary.
    ShardRange r0 = ShardRangeFor(n, p.shards, 0);
    EXPECT_GT(r0.end, 300u);
    EXPECT_LT(r0.end, 817u);
  }
  const std::vector<float> init = Values(n, 42);

  // Expected trajectory, in the shard's order of operations.
  std::vector<std::vector<float>> expected(kSteps + 1);
  expected[0] = init;
  const float inv_w = 1.0f / static_cast<float>(p.workers);
  for (int t = 0; t < kSteps; ++t) {
    std::vector<float> acc(n, 0.0f);
    for (uint32_t w = 0; w < p.workers; ++w) {
      std::vector<float> g = Gradient(n, w, t);
      for (uint64_t i = 0; i < n; ++i) acc[i] += g[i];
    }
    expected[t + 1] = expected[t];
    for (uint64_t i = 0; i < n; ++i) expected[t + 1][i] -= acc[i] * inv_w;
  }

  struct Result {
    std::vector<absl::Status> status;
    std::vector<std::vector<float>> weights;
    ClientStats stats;
  };
  std::vector<Result> results(p.workers);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < p.workers; ++w) {
    threads.emplace_back([&, w] {
      Result& r = results[w];
      auto client = Client::Connect(
          Options(*cluster, w, v1::CODEC_FP32, v1::CODEC_FP32));
      if (!client.ok()) {
        r.status.push_back(client.status());
        return;
      }
      r.status.push_back((*client)->Register(layout, init));
      if (!r.status.back().ok()) return;
      r.weights.emplace_back((*client)->weights().begin(),
                             (*client)->weights().end());
      for (int t = 0; t < kSteps; ++t) {
        r.status.push_back((*client)->Step(Gradient(n, w, t)));
        if (!r.status.back().ok()) return;
        EXPECT_EQ((*client)->step(), static_cast<uint64_t>(t + 1));
        r.weights.emplace_back((*client)->weights().begin(),
                               (*client)->weights().end());
      }
      r.stats = (*client)->stats();
    });
  }
  for (std::thread& t : threads) t.join();

  for (uint32_t w = 0; w < p.workers; ++w) {
    const Result& r = results[w];
    for (const absl::Status& s : r.status) ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(r.weights.size(), static_cast<size_t>(kSteps + 1));
    for (int t = 0; t <= kSteps; ++t) {
      size_t differ = 0, first = n;
      for (uint64_t i = 0; i < n; ++i) {
        if (std::memcmp(&r.weights[t][i], &expected[t][i], 4) != 0) {
          if (first == n) first = i;
          ++differ;
        }
      }
      EXPECT_EQ(differ, 0u) << "worker " << w << " step " << t
                            << ", first differing index " << first;
    }
    // fp32 pulls are snapshots: one per shard per step (Register's found
    // the weights it registered with: nothing).
    EXPECT_EQ(r.stats.steps, static_cast<uint64_t>(kSteps));
    EXPECT_EQ(r.stats.push_payload_bytes, kSteps * n * 4);
    EXPECT_EQ(r.stats.pull_payload_bytes, kSteps * n * 4);
    EXPECT_EQ(r.stats.snapshots, kSteps * uint64_t{p.shards});
    EXPECT_EQ(r.stats.checksum_mismatches, 0u);
  }
  for (uint32_t s = 0; s < p.shards; ++s) {
    v1::GetStatusResponse st = cluster->shard(s)->Status();
    EXPECT_EQ(st.current_step(), static_cast<uint64_t>(kSteps));
    EXPECT_EQ(st.pushes_pending(), 0u);
    ShardRange r = ShardRangeFor(n, p.shards, s);
    EXPECT_EQ(st.shard_begin(), r.begin);
    EXPECT_EQ(st.shard_end(), r.end);
    EXPECT_EQ(st.replica_checksum(),
              ChecksumOf(absl::MakeConstSpan(expected[kSteps])
                             .subspan(r.begin, r.size())));
  }
}

INSTANTIATE_TEST_SUITE_P(
    ShardsAndWorkers, ClientSplitMerge,
    ::testing::Values(SplitCase{1, 2}, SplitCase{2, 3}, SplitCase{3, 4}),
    [](const ::testing::TestParamInfo<SplitCase>& info) {
      return absl::StrCat(info.param.shards, "Shards", info.param.workers,
                          "Workers");
    });

// --- Replica logic --------------------------------------------------------

// Register pulls nothing when the worker's initial weights are the shards'
// (the installer's: workers seeded alike), and the snapshot when they are
// not; the replicas are the installer's weights either way.
TEST(ClientReplica, RegisterPullsNothingWithTheShardsWeightsElseASnapshot) {
  constexpr uint32_t kShards = 2;
  auto cluster = StartCluster(kShards, 3, ExactSgd(), v1::CODEC_ONEBIT);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  const std::vector<float> init = Values(n, 5);
  std::vector<std::unique_ptr<Client>> c;
  for (uint32_t w = 0; w < 3; ++w) {
    auto made = Client::Connect(Options(*cluster, w, v1::CODEC_ONEBIT));
    ASSERT_TRUE(made.ok()) << made.status();
    c.push_back(*std::move(made));
  }
  ASSERT_TRUE(c[0]->Register(layout, init).ok());  // the installer
  ASSERT_TRUE(c[1]->Register(layout, init).ok());
  ASSERT_TRUE(c[2]->Register(layout, Values(n, 6)).ok());
  for (uint32_t w = 0; w < 2; ++w) {
    EXPECT_EQ(c[w]->stats().snapshots, 0u) << "worker " << w;
    EXPECT_EQ(c[w]->stats().pull_payload_bytes, 0u) << "worker " << w;
  }
  EXPECT_EQ(c[2]->stats().snapshots, kShards);
  EXPECT_EQ(c[2]->stats().pull_payload_bytes, n * 4);
  for (uint32_t w = 0; w < 3; ++w) {
    EXPECT_TRUE(BitEqual(c[w]->weights(), init)) << "worker " << w;
    EXPECT_EQ(c[w]->stats().checksum_mismatches, 0u) << "worker " << w;
  }
  std::vector<std::thread> threads;
  std::vector<absl::Status> st(3);
  for (uint32_t w = 0; w < 3; ++w) {
    threads.emplace_back(
        [&, w] { st[w] = c[w]->Step(Gradient(n, w, 0)); });
  }
  for (std::thread& t : threads) t.join();
  for (uint32_t w = 0; w < 3; ++w) {
    ASSERT_TRUE(st[w].ok()) << "worker " << w << ": " << st[w];
    EXPECT_TRUE(BitEqual(c[w]->weights(), c[0]->weights())) << "worker " << w;
  }
}

// With 1-bit pulls the replica moves by deltas: the client's weights hash to
// each shard's replica checksum, only the Register pull is a snapshot, and a
// client that joins later (same worker id) gets a snapshot equal to it.
TEST(ClientReplica, OneBitPullsKeepReplicaInSyncAndLateJoinerGetsSnapshot) {
  constexpr uint32_t kShards = 2;
  constexpr int kSteps = 20;
  OptimizerConfig opt;
  opt.kind = OptimizerKind::kSgd;
  opt.lr = 0.05f;
  opt.momentum = 0.9f;
  auto cluster = StartCluster(kShards, 1, opt, v1::CODEC_ONEBIT);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  const std::vector<float> init = Values(n, 5);

  auto a = Client::Connect(Options(*cluster, 0, v1::CODEC_ONEBIT));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE((*a)->Register(layout, init).ok());
  EXPECT_TRUE(BitEqual((*a)->weights(), init));
  for (int t = 0; t < kSteps; ++t) {
    absl::Status s = (*a)->Step(Gradient(n, 0, t));
    ASSERT_TRUE(s.ok()) << "step " << t << ": " << s;
    for (uint32_t sh = 0; sh < kShards; ++sh) {
      ShardRange r = ShardRangeFor(n, kShards, sh);
      ASSERT_EQ(ChecksumOf((*a)->weights().subspan(r.begin, r.size())),
                cluster->shard(sh)->Status().replica_checksum())
          << "shard " << sh << " after step " << t;
    }
  }
  EXPECT_EQ((*a)->step(), static_cast<uint64_t>(kSteps));
  EXPECT_FALSE(BitEqual((*a)->weights(), init));
  const ClientStats& sa = (*a)->stats();
  // Register pulled nothing (its weights are the ones it installed), and
  // every step's pull was a delta.
  EXPECT_EQ(sa.snapshots, 0u) << "deltas must be used after Register";
  EXPECT_EQ(sa.checksum_mismatches, 0u);
  EXPECT_EQ(sa.retries, 0u);
  uint64_t onebit_all = 0;
  for (uint32_t sh = 0; sh < kShards; ++sh) {
    onebit_all += OneBitBytes(ShardRangeFor(n, kShards, sh).size());
  }
  EXPECT_EQ(sa.pull_payload_bytes, kSteps * onebit_all);
  EXPECT_EQ(sa.push_payload_bytes, kSteps * onebit_all);

  // A second client for the same worker id (a restarted worker).
  auto b = Client::Connect(Options(*cluster, 0, v1::CODEC_ONEBIT));
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE((*b)->Register(layout, Values(n, 99)).ok());  // ignored weights
  EXPECT_EQ((*b)->step(), static_cast<uint64_t>(kSteps));
  EXPECT_EQ((*b)->stats().snapshots, kShards);
  EXPECT_TRUE(BitEqual((*b)->weights(), (*a)->weights()));

  // b takes over; a, one step behind, pushes a step the shard already has
  // (deduplicated) and catches up through the delta, not a snapshot.
  ASSERT_TRUE((*b)->Step(Gradient(n, 0, kSteps)).ok());
  ASSERT_TRUE((*a)->Step(Gradient(n, 0, 12345)).ok());
  EXPECT_EQ((*a)->step(), (*b)->step());
  EXPECT_TRUE(BitEqual((*a)->weights(), (*b)->weights()));
  EXPECT_EQ((*a)->stats().snapshots, 0u);
  for (uint32_t sh = 0; sh < kShards; ++sh) {
    EXPECT_EQ(cluster->shard(sh)->Status().current_step(), kSteps + 1u);
  }
  for (int t = 1; t < 5; ++t) {
    ASSERT_TRUE((*b)->Step(Gradient(n, 0, kSteps + t)).ok());
  }
  EXPECT_EQ((*b)->stats().snapshots, kShards);
  EXPECT_EQ((*b)->stats().checksum_mismatches, 0u);

  // a is now 4 steps behind: the shard answers a newer step than a asked
  // for. a does not stage that answer; it rejoins both shards and takes the
  // rounds' weights (a worker stalled past its lease, tests/worker/
  // client_faults_test.cc), its push of the old step acknowledged as a
  // duplicate.
  absl::Status behind = (*a)->Step(Gradient(n, 0, 999));
  ASSERT_TRUE(behind.ok()) << behind;
  EXPECT_EQ((*a)->step(), (*b)->step());
  EXPECT_TRUE(BitEqual((*a)->weights(), (*b)->weights()));
  EXPECT_EQ((*a)->stats().snapshots, kShards);
  EXPECT_EQ((*a)->stats().rejoins, kShards);
}

// The replica is identical across workers (deterministic decoding) while
// they push different gradients through 1-bit codecs both ways.
TEST(ClientReplica, WorkersInThreadsHoldIdenticalReplicas) {
  constexpr uint32_t kShards = 3, kWorkers = 3;
  constexpr int kSteps = 6;
  OptimizerConfig opt;
  opt.kind = OptimizerKind::kAdam;
  auto cluster = StartCluster(kShards, kWorkers, opt, v1::CODEC_ONEBIT);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  const std::vector<float> init = Values(n, 8);
  std::vector<std::vector<float>> final_weights(kWorkers);
  std::vector<absl::Status> status(kWorkers);
  std::vector<ClientStats> stats(kWorkers);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      auto c = Client::Connect(Options(*cluster, w, v1::CODEC_ONEBIT));
      if (!c.ok()) {
        status[w] = c.status();
        return;
      }
      status[w] = (*c)->Register(layout, init);
      for (int t = 0; t < kSteps && status[w].ok(); ++t) {
        status[w] = (*c)->Step(Gradient(n, w, t));
      }
      final_weights[w].assign((*c)->weights().begin(), (*c)->weights().end());
      stats[w] = (*c)->stats();
    });
  }
  for (std::thread& t : threads) t.join();
  for (uint32_t w = 0; w < kWorkers; ++w) {
    ASSERT_TRUE(status[w].ok()) << "worker " << w << ": " << status[w];
    EXPECT_TRUE(BitEqual(final_weights[w], final_weights[0])) << "worker " << w;
    EXPECT_EQ(stats[w].snapshots, 0u);  // the same initial weights: none
    EXPECT_EQ(stats[w].checksum_mismatches, 0u);
  }
  for (uint32_t s = 0; s < kShards; ++s) {
    ShardRange r = ShardRangeFor(n, kShards, s);
    EXPECT_EQ(ChecksumOf(absl::MakeConstSpan(final_weights[0])
                             .subspan(r.begin, r.size())),
              cluster->shard(s)->Status().replica_checksum());
  }
}

// A worker that crashed after its push reached shard 0 but not shard 1
// leaves shard 0 one round ahead (the other workers' pushes completed it)
// and shard 1 waiting for that worker. Its restart must be able to rejoin:
// the push to shard 0 is acknowledged as a duplicate, shard 1 completes its
// round, and the replica comes back in sync. Before the fix Register refused
// with "shards disagree on the step" and the whole job stalled.
TEST(ClientReplica, Issue4RestartAfterPartialPushRejoinsShardsOneStepApart) {
  constexpr uint32_t kShards = 2;
  auto cluster = StartCluster(kShards, 1, ExactSgd(), v1::CODEC_ONEBIT);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  const std::vector<float> init = Values(n, 21);
  {
    auto first = Client::Connect(Options(*cluster, 0, v1::CODEC_FP32));
    ASSERT_TRUE(first.ok());
    ASSERT_TRUE((*first)->Register(layout, init).ok());
    ASSERT_TRUE((*first)->Step(Gradient(n, 0, 0)).ok());
  }
  // The crashed incarnation's last act: step 1 pushed to shard 0 only.
  const ShardRange r0 = ShardRangeFor(n, kShards, 0);
  const std::vector<float> crashed = Gradient(n, 0, 777);
  {
    auto channel = grpc::CreateChannel(cluster->addresses[0],
                                       grpc::InsecureChannelCredentials());
    auto stub = v1::ParameterServer::NewStub(channel);
    v1::PushRequest req;
    req.set_worker_id(0);
    req.set_step(1);
    req.set_space(v1::GRADIENT_SPACE_RAW);
    v1::EncodedTensor* g = req.mutable_gradient();
    g->set_codec(v1::CODEC_FP32);
    g->set_num_elements(r0.size());
    g->set_payload(std::string(
        reinterpret_cast<const char*>(crashed.data() + r0.begin),
        r0.size() * sizeof(float)));
    v1::PushResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Status st = stub->Push(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ASSERT_EQ(resp.current_step(), 2u);
  }
  ASSERT_EQ(cluster->shard(0)->Status().current_step(), 2u);
  ASSERT_EQ(cluster->shard(1)->Status().current_step(), 1u);

  auto c = Client::Connect(Options(*cluster, 0, v1::CODEC_FP32));
  ASSERT_TRUE(c.ok());
  absl::Status reg = (*c)->Register(layout, init);
  ASSERT_TRUE(reg.ok()) << reg;
  EXPECT_EQ((*c)->step(), 1u);  // the step the lagging shard waits for
  const std::vector<float> g = Gradient(n, 0, 1);
  ASSERT_TRUE((*c)->Step(g).ok());
  EXPECT_EQ((*c)->step(), 2u);
  for (uint32_t s = 0; s < kShards; ++s) {
    v1::GetStatusResponse st = cluster->shard(s)->Status();
    EXPECT_EQ(st.current_step(), 2u) << "shard " << s;
    ShardRange r = ShardRangeFor(n, kShards, s);
    EXPECT_EQ(ChecksumOf((*c)->weights().subspan(r.begin, r.size())),
              st.replica_checksum())
        << "shard " << s;
  }
  EXPECT_EQ((*c)->stats().checksum_mismatches, 0u);
  // And training goes on with deltas.
  const uint64_t snapshots = (*c)->stats().snapshots;
  for (int t = 2; t < 5; ++t) ASSERT_TRUE((*c)->Step(Gradient(n, 0, t)).ok());
  EXPECT_EQ((*c)->stats().snapshots, snapshots);
  EXPECT_EQ(cluster->shard(1)->Status().current_step(), 5u);
}

// --- 1-bit Adam -------------------------------------------------------------

// After freeze_step rounds the client fetches each shard's frozen variance
// once, switches from the fp32 warmup codec to 1-bit pushes in the
// preconditioned space (the shard refuses RAW then), and reports the stage.
TEST(ClientOneBitAdam, SwitchesToPreconditionedOneBitPushesAfterFreeze) {
  constexpr uint32_t kShards = 2, kWorkers = 2;
  constexpr int kSteps = 8, kFreeze = 3;
  OptimizerConfig opt;
  opt.kind = OptimizerKind::kOneBitAdam;
  opt.freeze_step = kFreeze;
  auto cluster = StartCluster(kShards, kWorkers, opt, v1::CODEC_ONEBIT);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  const std::vector<float> init = Values(n, 3);
  std::vector<std::vector<v1::OptimizerStage>> stages(kWorkers);
  std::vector<absl::Status> status(kWorkers);
  std::vector<ClientStats> stats(kWorkers);
  std::vector<std::vector<float>> final_weights(kWorkers);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      auto c = Client::Connect(
          Options(*cluster, w, v1::CODEC_ONEBIT, v1::CODEC_FP32));
      if (!c.ok()) {
        status[w] = c.status();
        return;
      }
      status[w] = (*c)->Register(layout, init);
      if (!status[w].ok()) return;
      stages[w].push_back((*c)->stage());
      for (int t = 0; t < kSteps; ++t) {
        status[w] = (*c)->Step(Gradient(n, w, t));
        if (!status[w].ok()) {
          status[w] = absl::Status(status[w].code(),
                                   absl::StrCat("step ", t, ": ",
                                                status[w].message()));
          return;
        }
        stages[w].push_back((*c)->stage());
      }
      stats[w] = (*c)->stats();
      final_weights[w].assign((*c)->weights().begin(), (*c)->weights().end());
    });
  }
  for (std::thread& t : threads) t.join();
  uint64_t onebit_all = 0;
  for (uint32_t s = 0; s < kShards; ++s) {
    onebit_all += OneBitBytes(ShardRangeFor(n, kShards, s).size());
  }
  for (uint32_t w = 0; w < kWorkers; ++w) {
    ASSERT_TRUE(status[w].ok()) << "worker " << w << ": " << status[w];
    ASSERT_EQ(stages[w].size(), static_cast<size_t>(kSteps + 1));
    for (int t = 0; t <= kSteps; ++t) {
      EXPECT_EQ(stages[w][t], t < kFreeze ? v1::OPTIMIZER_STAGE_WARMUP
                                          : v1::OPTIMIZER_STAGE_COMPRESSION)
          << "worker " << w << " at step " << t;
    }
    // fp32 while warming up, 1-bit (one scale per 256) after the freeze.
    EXPECT_EQ(stats[w].push_payload_bytes,
              kFreeze * n * 4 + (kSteps - kFreeze) * onebit_all);
    EXPECT_EQ(stats[w].snapshots, 0u);
    // The frozen variance, fp32, fetched once per shard at the freeze.
    EXPECT_EQ(stats[w].variance_payload_bytes, n * 4);
    EXPECT_TRUE(BitEqual(final_weights[w], final_weights[0]));
  }
  for (uint32_t s = 0; s < kShards; ++s) {
    v1::GetStatusResponse st = cluster->shard(s)->Status();
    EXPECT_EQ(st.stage(), v1::OPTIMIZER_STAGE_COMPRESSION);
    EXPECT_EQ(st.current_step(), static_cast<uint64_t>(kSteps));
    prometheus::Registry& reg = *cluster->registries[s];
    // Each worker fetched the preconditioner exactly once per shard.
    EXPECT_EQ(CounterSum(reg, "pserver_server_requests_total",
                         {{"method", "GetFrozenVariance"}}),
              kWorkers);
    // No push was refused for its space (or anything else); only Registers
    // while the first worker installed the model were told to retry (busy).
    EXPECT_EQ(CounterSum(reg, "pserver_server_rejected_requests_total") -
                  CounterSum(reg, "pserver_server_rejected_requests_total",
                             {{"reason", "busy"}}),
              0);
  }
}

// Final weights of worker 0 after `steps` steps of kWorkers workers (fp32
// both ways) against a fresh 2-shard cluster running `opt`; the serialized
// client state of worker 0 in *state.
std::vector<float> RunFp32(const OptimizerConfig& opt, int steps,
                           std::string* state) {
  constexpr uint32_t kShards = 2, kWorkers = 2;
  auto cluster = StartCluster(kShards, kWorkers, opt, v1::CODEC_FP32);
  EXPECT_NE(cluster, nullptr);
  if (cluster == nullptr) return {};
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  const std::vector<float> init = Values(n, 3);
  std::vector<absl::Status> status(kWorkers);
  std::vector<float> weights;
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      auto c = Client::Connect(Options(*cluster, w, v1::CODEC_FP32));
      if (!(status[w] = c.status()).ok()) return;
      if (!(status[w] = (*c)->Register(layout, init)).ok()) return;
      for (int t = 0; t < steps; ++t) {
        if (!(status[w] = (*c)->Step(Gradient(n, w, t))).ok()) return;
      }
      if (w == 0) {
        weights.assign((*c)->weights().begin(), (*c)->weights().end());
        absl::StatusOr<std::string> st = (*c)->SerializeState();
        status[w] = st.status();
        if (st.ok()) *state = *st;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (uint32_t w = 0; w < kWorkers; ++w) EXPECT_TRUE(status[w].ok()) << status[w];
  return weights;
}

// --onebit_momentum=worker through real shards: with fp32 pushes the workers'
// momenta average to the shard-side momentum, so the weights agree to
// rounding with the default mode's; the momentum is in the client state
// (format PSWKST02).
TEST(ClientOneBitAdam, WorkerMomentumMatchesShardMomentumWithoutCompression) {
  OptimizerConfig opt;
  opt.kind = OptimizerKind::kOneBitAdam;
  opt.freeze_step = 3;
  std::string server_state, worker_state;
  std::vector<float> a = RunFp32(opt, 12, &server_state);
  opt.worker_momentum = true;
  std::vector<float> b = RunFp32(opt, 12, &worker_state);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  const std::vector<float> init = Values(a.size(), 3);
  double worst = 0, moved = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(double{a[i]} - b[i]));
    moved = std::max(moved, std::abs(double{a[i]} - init[i]));
  }
  EXPECT_GT(moved, 1e-3);
  EXPECT_LT(worst, 1e-5);
  EXPECT_EQ(server_state.substr(0, 8), "PSWKST02");
  // The worker-momentum state holds one more slice-sized array of floats.
  EXPECT_EQ(worker_state.size(), server_state.size() + 4 * a.size());
}

// --- Error paths -------------------------------------------------------------

TEST(ClientErrors, NonFiniteGradientIsRefusedBeforeAnythingIsSent) {
  constexpr uint32_t kShards = 2;
  auto cluster = StartCluster(kShards, 1, ExactSgd(), v1::CODEC_FP32);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  const std::vector<float> init = Values(n, 11);
  // 1-bit pushes with error feedback: a refused step must leave the
  // residual untouched.
  auto c = Client::Connect(Options(*cluster, 0, v1::CODEC_ONEBIT));
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Register(layout, init).ok());
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    std::vector<float> g = Gradient(n, 0, 0);
    g[n - 3] = bad;  // in the last shard
    absl::Status s = (*c)->Step(g);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("gradient[", n - 3, "]")));
    EXPECT_EQ((*c)->step(), 0u);
    EXPECT_EQ((*c)->ResidualNorm(), 0.0);
    EXPECT_EQ((*c)->stats().push_payload_bytes, 0u);
    EXPECT_TRUE(BitEqual((*c)->weights(), init));
    for (uint32_t sh = 0; sh < kShards; ++sh) {
      v1::GetStatusResponse st = cluster->shard(sh)->Status();
      EXPECT_EQ(st.pushes_pending(), 0u);
      EXPECT_EQ(st.current_step(), 0u);
    }
  }
  // Wrong size, too.
  EXPECT_EQ((*c)->Step(std::vector<float>(n - 1)).code(),
            absl::StatusCode::kInvalidArgument);
  // The client is still usable.
  ASSERT_TRUE((*c)->Step(Gradient(n, 0, 0)).ok());
  EXPECT_EQ((*c)->step(), 1u);
  EXPECT_GT((*c)->ResidualNorm(), 0.0);
}

TEST(ClientErrors, StepBeforeRegisterIsFailedPrecondition) {
  auto cluster = StartCluster(1, 1, ExactSgd(), v1::CODEC_FP32);
  ASSERT_NE(cluster, nullptr);
  auto c = Client::Connect(Options(*cluster, 0, v1::CODEC_FP32));
  ASSERT_TRUE(c.ok());
  absl::Status s = (*c)->Step(std::vector<float>(10, 1.0f));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(cluster->shard(0)->Status().pushes_pending(), 0u);
  EXPECT_FALSE(cluster->shard(0)->registered());
}

TEST(ClientErrors, LayoutMismatchIsRefusedNamingTheDifference) {
  auto cluster = StartCluster(2, 2, ExactSgd(), v1::CODEC_FP32);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  auto first = Client::Connect(Options(*cluster, 0, v1::CODEC_FP32));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE((*first)->Register(layout, Values(n, 1)).ok());

  // Same element count, different shape of tensor 1.
  v1::ModelLayout other = layout;
  other.mutable_tensors(1)->clear_shape();
  other.mutable_tensors(1)->add_shape(11);
  other.mutable_tensors(1)->add_shape(47);
  ASSERT_EQ(TotalElements(other), n);
  auto second = Client::Connect(Options(*cluster, 1, v1::CODEC_FP32));
  ASSERT_TRUE(second.ok());
  absl::Status s = (*second)->Register(other, Values(n, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("tensors[1]"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("'b'"));
  // Refused registrations are not half-registered.
  EXPECT_EQ((*second)->Step(std::vector<float>(n)).code(),
            absl::StatusCode::kFailedPrecondition);
  for (uint32_t sh = 0; sh < 2; ++sh) {
    EXPECT_EQ(cluster->shard(sh)->Status().workers_registered(), 1u);
  }

  // A different size is refused too (the shard ranges or layout differ).
  v1::ModelLayout bigger = layout;
  bigger.mutable_tensors(3)->add_shape(2);
  absl::Status s2 = (*second)->Register(bigger, Values(n + 1, 1));
  EXPECT_EQ(s2.code(), absl::StatusCode::kFailedPrecondition) << s2;
  EXPECT_THAT(std::string(s2.message()), HasSubstr("tensors[3]"));

  // Weights that do not match the layout never reach the network.
  absl::Status s3 = (*second)->Register(layout, Values(n - 1, 1));
  EXPECT_EQ(s3.code(), absl::StatusCode::kInvalidArgument) << s3;
}

TEST(ClientErrors, ConnectRefusesBadOptions) {
  ClientOptions o;
  o.server_addresses = {};
  EXPECT_EQ(Client::Connect(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.server_addresses = {"127.0.0.1:1"};
  o.num_workers = 2;
  o.worker_id = 2;
  absl::Status s = Client::Connect(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("worker_id"));
  o.num_workers = 0;
  o.worker_id = 0;
  EXPECT_EQ(Client::Connect(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.num_workers = 1;
  o.push_codec = static_cast<v1::Codec>(999);
  s = Client::Connect(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("push_codec"));
  o.push_codec = v1::CODEC_ONEBIT;
  EXPECT_TRUE(Client::Connect(o).ok());  // no RPC yet
}

// Shard 1 is down when Register starts and comes up 0.8 s later on the
// address the client was given: Register retries and succeeds.
TEST(ClientErrors, RegisterRetriesUntilALateShardComesUp) {
  ShardConfig config;
  config.num_shards = 2;
  config.num_workers = 1;
  config.optimizer = ExactSgd();
  const int port = FreePort();
  ASSERT_GT(port, 0);
  auto s0 = StartShard(config, 0, 0, nullptr);
  ASSERT_TRUE(s0.ok()) << s0.status();
  std::vector<std::string> addresses = {
      absl::StrCat("127.0.0.1:", (*s0)->port()),
      absl::StrCat("127.0.0.1:", port)};

  absl::Mutex mu;
  absl::StatusOr<std::unique_ptr<ShardServer>> s1 =
      absl::UnavailableError("not started");
  std::thread starter([&] {
    absl::SleepFor(absl::Milliseconds(800));
    auto s = StartShard(config, 1, port, nullptr);
    absl::MutexLock l(&mu);
    s1 = std::move(s);
  });
  ClientOptions o;
  o.server_addresses = addresses;
  o.push_codec = v1::CODEC_FP32;
  o.rpc_timeout = absl::Milliseconds(250);
  o.retry_budget = absl::Seconds(20);
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  absl::Time start = absl::Now();
  absl::Status st = (*c)->Register(layout, Values(n, 2));
  starter.join();
  {
    absl::MutexLock l(&mu);
    ASSERT_TRUE(s1.ok()) << s1.status();
  }
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(700));
  EXPECT_GT((*c)->stats().retries, 0u);
  ASSERT_TRUE((*c)->Step(Gradient(n, 0, 0)).ok());
  EXPECT_EQ((*c)->step(), 1u);
}

// A shard that never comes up: Register gives up after the retry budget
// with a retriable code and names the shard.
TEST(ClientErrors, RegisterGivesUpNamingTheDeadShard) {
  ShardConfig config;
  config.num_shards = 2;
  config.num_workers = 1;
  config.optimizer = ExactSgd();
  auto s0 = StartShard(config, 0, 0, nullptr);
  ASSERT_TRUE(s0.ok());
  const int port = FreePort();
  ASSERT_GT(port, 0);
  const std::string dead = absl::StrCat("127.0.0.1:", port);
  ClientOptions o;
  o.server_addresses = {absl::StrCat("127.0.0.1:", (*s0)->port()), dead};
  o.rpc_timeout = absl::Milliseconds(200);
  o.retry_budget = absl::Seconds(1);
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  const v1::ModelLayout layout = TestLayout();
  absl::Time start = absl::Now();
  absl::Status st = (*c)->Register(layout, Values(TotalElements(layout), 2));
  absl::Duration took = absl::Now() - start;
  EXPECT_THAT(st.code(), AnyOf(absl::StatusCode::kUnavailable,
                               absl::StatusCode::kDeadlineExceeded))
      << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr(dead));
  EXPECT_THAT(std::string(st.message()), HasSubstr("shard 1"));
  EXPECT_GE(took, absl::Seconds(1));
  EXPECT_LT(took, absl::Seconds(6));
  EXPECT_GT((*c)->stats().retries, 0u);
  EXPECT_EQ((*c)->Step(std::vector<float>(10)).code(),
            absl::StatusCode::kFailedPrecondition);
}

// --- Byte accounting -------------------------------------------------------

// What the clients count equals what the shards' metrics count, and both
// equal the codec format: onebit n = 4 ceil(n / 256) + ceil(n / 8) bytes.
TEST(ClientBytes, PayloadBytesMatchServerMetricsAndCodecFormat) {
  constexpr uint32_t kShards = 3, kWorkers = 2;
  constexpr int kSteps = 5;
  OptimizerConfig opt;
  opt.kind = OptimizerKind::kAdam;
  auto cluster = StartCluster(kShards, kWorkers, opt, v1::CODEC_ONEBIT);
  ASSERT_NE(cluster, nullptr);
  v1::ModelLayout layout = TestLayout();
  layout.mutable_tensors(0)->set_shape(1, 1000);  // 3000 + 595 = 3595
  const uint64_t n = TotalElements(layout);
  const std::vector<float> init = Values(n, 4);
  std::vector<ClientStats> stats(kWorkers);
  std::vector<absl::Status> status(kWorkers);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      auto c = Client::Connect(Options(*cluster, w, v1::CODEC_ONEBIT));
      if (!c.ok()) {
        status[w] = c.status();
        return;
      }
      status[w] = (*c)->Register(layout, init);
      for (int t = 0; t < kSteps && status[w].ok(); ++t) {
        status[w] = (*c)->Step(Gradient(n, w, t));
      }
      stats[w] = (*c)->stats();
    });
  }
  for (std::thread& t : threads) t.join();
  uint64_t onebit_all = 0;
  for (uint32_t s = 0; s < kShards; ++s) {
    onebit_all += OneBitBytes(ShardRangeFor(n, kShards, s).size());
  }
  uint64_t client_push = 0, client_pull = 0;
  for (uint32_t w = 0; w < kWorkers; ++w) {
    ASSERT_TRUE(status[w].ok()) << status[w];
    EXPECT_EQ(stats[w].push_payload_bytes, kSteps * onebit_all);
    EXPECT_EQ(stats[w].pull_payload_bytes, kSteps * onebit_all);
    EXPECT_EQ(stats[w].push_fp32_bytes, kSteps * n * 4);
    EXPECT_EQ(stats[w].pull_fp32_bytes, (kSteps + 1) * n * 4);
    client_push += stats[w].push_payload_bytes;
    client_pull += stats[w].pull_payload_bytes;
  }
  double server_push = 0, server_pull = 0;
  for (uint32_t s = 0; s < kShards; ++s) {
    prometheus::Registry& reg = *cluster->registries[s];
    server_push +=
        CounterSum(reg, "pserver_server_received_payload_bytes_total");
    server_pull += CounterSum(reg, "pserver_server_sent_payload_bytes_total");
  }
  EXPECT_EQ(server_push, static_cast<double>(client_push));
  EXPECT_EQ(server_pull, static_cast<double>(client_pull));
}

}  // namespace
}  // namespace pserver
