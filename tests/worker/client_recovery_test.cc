// Recovery decided on the shard's reason (worker/recovery.h) and the
// replica's all-or-nothing pulls (worker/replica.h), against real in-process
// shards on loopback; a fault-injecting proxy (tests/worker/shard_proxy.h)
// in front of a shard fails its pulls.
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "common/fp32_tensor.h"
#include "common/layout.h"
#include "common/rejection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/shard_server.h"
#include "tests/worker/client_test_util.h"
#include "tests/worker/shard_proxy.h"
#include "worker/client.h"
#include "worker/recovery.h"
#include "worker/replica.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;
using namespace testing_util;  // NOLINT: the shared test helpers

// Workers 0 and 1, fp32, registered, with timeouts long enough that a wait
// on another worker shows as the test's own 60 s bound, then step 0 taken
// together.
std::vector<std::unique_ptr<Client>> TwoWorkersPastStepZero(
    Cluster& cluster, const v1::ModelLayout& layout) {
  const uint64_t n = TotalElements(layout);
  std::vector<std::unique_ptr<Client>> w;
  for (uint32_t id = 0; id < 2; ++id) {
    ClientOptions o = Options(cluster, id, v1::CODEC_FP32);
    o.rpc_timeout = o.pull_timeout = o.retry_budget = absl::Seconds(120);
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return {};
    EXPECT_TRUE((*c)->Register(layout, Values(n, 8)).ok());
    w.push_back(std::move(c).value());
  }
  absl::Status st0, st1;
  std::thread first([&] { st1 = w[1]->Step(Gradient(n, 1, 0)); });
  st0 = w[0]->Step(Gradient(n, 0, 0));
  first.join();
  EXPECT_TRUE(st0.ok() && st1.ok()) << st0 << "; " << st1;
  if (!st0.ok() || !st1.ok()) return {};
  return w;
}

// Waits up to 60 s for `done`, polling every 10 ms.
bool WaitFor(const std::function<bool()>& done) {
  for (const absl::Time until = absl::Now() + absl::Seconds(60);
       absl::Now() < until; absl::SleepFor(absl::Milliseconds(10))) {
    if (done()) return true;
  }
  return false;
}

// Both workers at step 2 on before - mean(step 1's gradients) (exact: the
// values are multiples of 1/64).
void ExpectStepOneApplied(const std::vector<std::unique_ptr<Client>>& w,
                          const std::vector<float>& before) {
  const uint64_t n = before.size();
  const std::vector<float> g0 = Gradient(n, 0, 1), g1 = Gradient(n, 1, 1);
  std::vector<float> expected(n);
  for (uint64_t i = 0; i < n; ++i) {
    expected[i] = before[i] - (g0[i] + g1[i]) / 2;
  }
  for (const auto& c : w) {
    EXPECT_EQ(c->step(), 2u);
    EXPECT_TRUE(BitEqual(c->weights(), expected));
  }
}

// --- The decision ------------------------------------------------------------

TEST(ClientRecovery, DecidesOnTheReasonNotTheCode) {
  const absl::Status fp = absl::FailedPreconditionError("x");
  EXPECT_EQ(RecoveryFor(Reject(v1::REJECT_REASON_WRONG_SPACE, fp)),
            Recovery::kFail);
  EXPECT_EQ(RecoveryFor(Reject(v1::REJECT_REASON_CONFIG_MISMATCH, fp)),
            Recovery::kFail);
  EXPECT_EQ(RecoveryFor(Reject(v1::REJECT_REASON_LAYOUT_MISMATCH, fp)),
            Recovery::kFail);
  EXPECT_EQ(RecoveryFor(Reject(v1::REJECT_REASON_NOT_FROZEN, fp)),
            Recovery::kFail);
  EXPECT_EQ(RecoveryFor(fp), Recovery::kFail);  // no reason: do not guess
  EXPECT_EQ(RecoveryFor(Reject(v1::REJECT_REASON_NOT_REGISTERED, fp)),
            Recovery::kRejoinAndResend);
  EXPECT_EQ(RecoveryFor(Reject(v1::REJECT_REASON_FUTURE_STEP, fp)),
            Recovery::kRejoinAndResend);
  EXPECT_EQ(RecoveryFor(Reject(v1::REJECT_REASON_PULL_BEFORE_PUSH, fp)),
            Recovery::kRejoinAndResend);
  const absl::Status aborted = absl::AbortedError("x");
  EXPECT_EQ(RecoveryFor(Reject(v1::REJECT_REASON_DROPPED_WORKER, aborted)),
            Recovery::kRejoinNextRound);
  EXPECT_EQ(RecoveryFor(Reject(v1::REJECT_REASON_STALE_STEP, aborted)),
            Recovery::kRejoinNextRound);
  EXPECT_EQ(RecoveryFor(aborted), Recovery::kFail);
  EXPECT_EQ(RecoveryFor(Reject(v1::REJECT_REASON_UNKNOWN_WORKER,
                               absl::InvalidArgumentError("x"))),
            Recovery::kFail);
}

// Two shards that disagree on --onebit_mode: shard 0 (whose Register answer
// the client follows) compresses raw gradients, shard 1 expects
// preconditioned ones. After the freeze shard 1 refuses the push with
// FAILED_PRECONDITION / WRONG_SPACE. Before issue 9 the client took that
// code for a restarted shard: it registered again and pushed again, and
// failed only after that. Now it fails at once with the shard's message,
// without registering again.
TEST(ClientRecovery, Issue9WrongSpaceFailsAtOnceWithoutRejoining) {
  constexpr int kFreeze = 2;
  OptimizerConfig opt;
  opt.kind = OptimizerKind::kOneBitAdam;
  opt.freeze_step = kFreeze;
  auto cluster = std::make_unique<Cluster>();
  cluster->config.num_shards = 2;
  cluster->config.num_workers = 1;
  cluster->config.pull_codec = v1::CODEC_FP32;
  for (uint32_t s = 0; s < 2; ++s) {
    ShardConfig c = cluster->config;
    c.optimizer = opt;
    c.optimizer.preconditioned = s == 1;
    cluster->registries.push_back(std::make_unique<prometheus::Registry>());
    auto server = StartShard(c, s, 0, cluster->registries.back().get());
    ASSERT_TRUE(server.ok()) << server.status();
    cluster->addresses.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
    cluster->servers.push_back(std::move(server).value());
  }
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  auto c = Client::Connect(Options(*cluster, 0, v1::CODEC_ONEBIT));
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Register(layout, Values(n, 5)).ok());
  for (int t = 0; t < kFreeze; ++t) {
    ASSERT_TRUE((*c)->Step(Gradient(n, 0, t)).ok()) << "step " << t;
  }
  ASSERT_EQ((*c)->stage(), v1::OPTIMIZER_STAGE_COMPRESSION);
  const std::vector<float> before((*c)->weights().begin(),
                                  (*c)->weights().end());
  const uint64_t retries = (*c)->stats().retries;
  prometheus::Registry& reg1 = *cluster->registries[1];
  const double registers = CounterSum(reg1, "pserver_server_requests_total",
                                      {{"method", "Register"}});

  const absl::Time start = absl::Now();
  absl::Status s = (*c)->Step(Gradient(n, 0, kFreeze));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(ReasonOf(s), v1::REJECT_REASON_WRONG_SPACE) << s;
  // The shard's own message, naming the shard.
  EXPECT_THAT(std::string(s.message()), HasSubstr("shard 1"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("space is RAW; expected PRECONDITIONED"));
  // At once: no re-registration, no retry, no second push.
  EXPECT_EQ((*c)->stats().rejoins, 0u);
  EXPECT_EQ((*c)->stats().retries, retries);
  EXPECT_EQ(CounterSum(reg1, "pserver_server_requests_total",
                       {{"method", "Register"}}),
            registers);
  EXPECT_EQ(CounterSum(reg1, "pserver_server_requests_total",
                       {{"method", "Push"}}),
            kFreeze + 1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // no pull deadline hit
  // The replica did not move.
  EXPECT_EQ((*c)->step(), static_cast<uint64_t>(kFreeze));
  EXPECT_TRUE(BitEqual((*c)->weights(), before));
}

// What the operator sees (ClientOptions::log): a shard that stops answering
// is reported once when its attempts start failing, and again when it
// answers (here: a restarted shard, NOT_REGISTERED), then the rejoin. A
// healthy step reports nothing.
TEST(ClientRecovery, AShardDownAndBackIsReportedOnceEachWay) {
  auto cluster = StartCluster(2, 1, ExactSgd(), v1::CODEC_FP32);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  ClientOptions o = Options(*cluster, 0, v1::CODEC_FP32);
  o.rpc_timeout = absl::Milliseconds(200);
  absl::Mutex mu;
  std::vector<std::string> lines;
  o.log = [&](absl::string_view line) {
    absl::MutexLock l(&mu);
    lines.emplace_back(line);
  };
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Register(layout, Values(n, 8)).ok());
  ASSERT_TRUE((*c)->Step(Gradient(n, 0, 0)).ok());
  {
    absl::MutexLock l(&mu);
    EXPECT_THAT(lines, testing::IsEmpty());
  }

  const int port = cluster->servers[1]->port();
  cluster->servers[1]->Shutdown(absl::ZeroDuration());
  cluster->servers[1].reset();
  std::thread restart([&] {
    absl::SleepFor(absl::Seconds(1));  // several attempts of 200 ms fail
    auto restarted = StartShard(cluster->config, 1, port, nullptr);
    ASSERT_TRUE(restarted.ok()) << restarted.status();
    cluster->servers[1] = std::move(restarted).value();
  });
  absl::Status s = (*c)->Step(Gradient(n, 0, 1));
  restart.join();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_GE((*c)->stats().retries, 2u);
  absl::MutexLock l(&mu);
  const std::string where = absl::StrCat("to shard 1 (", cluster->addresses[1], ")");
  ASSERT_EQ(lines.size(), 3u) << absl::StrJoin(lines, "\n");
  EXPECT_THAT(lines[0], testing::AllOf(testing::HasSubstr(where),
                                       testing::HasSubstr("failed: "),
                                       testing::HasSubstr("retrying for up to")));
  EXPECT_THAT(lines[1], testing::AllOf(testing::HasSubstr(where),
                                       testing::HasSubstr("answers again after")));
  EXPECT_THAT(lines[2], testing::HasSubstr(
                            absl::StrCat("rejoined shard 1 (", cluster->addresses[1],
                                         ") at step 1")));
}

// A shard that restarts from nothing answers NOT_REGISTERED: the client
// registers again (its replica slice stands in for the lost weights, at its
// step), pushes the step again, and training goes on exactly. The rejoin is
// counted on the registry the client was given.
TEST(ClientRecovery, Issue9RestartedShardIsRejoinedAndTrainingResumes) {
  constexpr uint32_t kShards = 2;
  auto cluster = StartCluster(kShards, 1, ExactSgd(), v1::CODEC_FP32);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  prometheus::Registry worker_registry;
  auto c = Client::Connect(Options(*cluster, 0, v1::CODEC_FP32),
                           &worker_registry);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Register(layout, Values(n, 8)).ok());
  for (int t = 0; t < 2; ++t) ASSERT_TRUE((*c)->Step(Gradient(n, 0, t)).ok());

  ASSERT_TRUE(RestartShard(*cluster, 1));

  const std::vector<float> before((*c)->weights().begin(),
                                  (*c)->weights().end());
  const std::vector<float> g = Gradient(n, 0, 2);
  absl::Status s = (*c)->Step(g);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ((*c)->step(), 3u);
  EXPECT_EQ((*c)->stats().rejoins, 1u);
  // x3 = x2 - g (one worker, lr 1): the restarted shard took the replica's
  // slice as its weights.
  std::vector<float> expected(n);
  for (uint64_t i = 0; i < n; ++i) expected[i] = before[i] - g[i];
  EXPECT_TRUE(BitEqual((*c)->weights(), expected));
  for (uint32_t sh = 0; sh < kShards; ++sh) {
    v1::GetStatusResponse st = cluster->shard(sh)->Status();
    EXPECT_EQ(st.current_step(), 3u) << "shard " << sh;
    ShardRange r = ShardRangeFor(n, kShards, sh);
    EXPECT_EQ(ChecksumOf((*c)->weights().subspan(r.begin, r.size())),
              st.replica_checksum())
        << "shard " << sh;
  }
  // Counted where it happened, on the given registry.
  EXPECT_EQ(CounterSum(worker_registry, "pserver_worker_rejoins_total"), 1);
  EXPECT_EQ(CounterSum(worker_registry, "pserver_worker_payload_bytes_total",
                       {{"direction", "push"}}),
            static_cast<double>((*c)->stats().push_payload_bytes));
  EXPECT_EQ(CounterSum(worker_registry, "pserver_worker_snapshots_total"),
            static_cast<double>((*c)->stats().snapshots));
  ASSERT_TRUE((*c)->Step(Gradient(n, 0, 3)).ok());
}

// A shard that restarts refuses a multi-chunk push at its first chunks; the
// chunks after the window were never encoded in that step. The resend must
// carry this step's gradient in every chunk: a kept chunk of the step before
// (bf16 is kept for resends; fp32 is re-encoded) was sent in their place.
TEST(ClientRecovery, AResendCarriesThisStepsGradientInEveryChunk) {
  constexpr uint32_t kShards = 2;
  auto cluster = StartCluster(kShards, 1, ExactSgd(), v1::CODEC_FP32,
                              kMinChunkElements);
  ASSERT_NE(cluster, nullptr);
  v1::ModelLayout layout;
  v1::TensorSpec* t = layout.add_tensors();
  t->set_name("w");
  t->add_shape(9001);  // 2 slices of ~4500: 5 chunks each, 4 sent at once
  const uint64_t n = TotalElements(layout);
  auto c = Client::Connect(Options(*cluster, 0, v1::CODEC_BF16));
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Register(layout, Values(n, 8)).ok());
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE((*c)->Step(Gradient(n, 0, step)).ok());
  }
  ASSERT_TRUE(RestartShard(*cluster, 1));

  const std::vector<float> before((*c)->weights().begin(),
                                  (*c)->weights().end());
  // Multiples of 1/64 in [-1, 1]: bf16 holds them exactly, so the step is
  // x - g bit for bit (one worker, lr 1).
  const std::vector<float> g = Gradient(n, 0, 2);
  absl::Status st = (*c)->Step(g);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ((*c)->stats().rejoins, 1u);
  std::vector<float> expected(n);
  for (uint64_t i = 0; i < n; ++i) expected[i] = before[i] - g[i];
  EXPECT_TRUE(BitEqual((*c)->weights(), expected));
}

// Worker 1's push is refused by a restarted shard 1 while shard 0 holds it
// (a push is answered once summed, after worker 0's push of that chunk).
// Worker 0 waits for worker 1 to rejoin shard 1 before it pushes, as it
// does when it waits on a round of shard 1 only that rejoin completes: so
// worker 1 must rejoin shard 1 without waiting for shard 0's answer. It
// used to wait (to the rpc timeout: the e2e shard failure test's 30 s
// stalls) and then found every round stuck behind it.
TEST(ClientRecovery, ARefusalIsRecoveredBeforeWaitingOnTheOtherShards) {
  auto cluster = StartCluster(2, 2, ExactSgd(), v1::CODEC_FP32);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  std::vector<std::unique_ptr<Client>> w =
      TwoWorkersPastStepZero(*cluster, layout);
  ASSERT_EQ(w.size(), 2u);
  ASSERT_TRUE(RestartShard(*cluster, 1));

  const std::vector<float> before(w[0]->weights().begin(),
                                  w[0]->weights().end());
  absl::Status st0, st1;
  std::thread second([&] { st1 = w[1]->Step(Gradient(n, 1, 1)); });
  EXPECT_TRUE(WaitFor([&] {
    return cluster->shard(1)->Status().workers_registered() > 0;
  })) << "worker 1 did not rejoin shard 1 while shard 0 held its push";
  st0 = w[0]->Step(Gradient(n, 0, 1));
  second.join();
  ASSERT_TRUE(st0.ok()) << st0;
  ASSERT_TRUE(st1.ok()) << st1;
  ExpectStepOneApplied(w, before);  // both rounds complete, one model
}

// The same for a pull: worker 0 pushed to both shards and waits for their
// rounds; shard 1 restarts and refuses its pull while shard 0's round waits
// for worker 1, which waits (as above) for worker 0 to push to shard 1
// again. Worker 0 must stop waiting on shard 0 and recover shard 1 first.
TEST(ClientRecovery, APullRefusalIsRecoveredBeforeWaitingOnTheOtherShards) {
  auto cluster = StartCluster(2, 2, ExactSgd(), v1::CODEC_FP32);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  std::vector<std::unique_ptr<Client>> w =
      TwoWorkersPastStepZero(*cluster, layout);
  ASSERT_EQ(w.size(), 2u);

  const std::vector<float> before(w[0]->weights().begin(),
                                  w[0]->weights().end());
  absl::Status st0, st1;
  std::thread second([&] { st0 = w[0]->Step(Gradient(n, 0, 1)); });
  // Worker 0's pushes are in on both shards: it waits for the rounds.
  WaitFor([&] {
    return cluster->shard(0)->Status().pushes_pending() > 0 &&
           cluster->shard(1)->Status().pushes_pending() > 0;
  });
  ASSERT_GT(cluster->shard(1)->Status().pushes_pending(), 0u);
  ASSERT_TRUE(RestartShard(*cluster, 1));
  EXPECT_TRUE(WaitFor([&] {
    return cluster->shard(1)->Status().pushes_pending() > 0;
  })) << "worker 0 did not push to the restarted shard 1 while shard 0 "
         "held its pull";
  st1 = w[1]->Step(Gradient(n, 1, 1));
  second.join();
  ASSERT_TRUE(st0.ok()) << st0;
  ASSERT_TRUE(st1.ok()) << st1;
  ExpectStepOneApplied(w, before);
}

// --- All-or-nothing pulls (hole 7) -------------------------------------------

// Shard 0 answers the pull, shard 1 (through the proxy) fails it. Before the
// fix PullAll had already applied shard 0's delta: the replica held shard 0
// at step 2 and shard 1 at step 1 while step() said 1. Now the replica's
// bytes and step are unchanged, and retrying the step (a duplicate push on
// both shards) completes it.
TEST(ClientReplica, Hole7PullAllLeavesReplicaUnchangedOnFailure) {
  constexpr uint32_t kShards = 2;
  auto cluster = StartCluster(kShards, 1, ExactSgd(), v1::CODEC_FP32);
  ASSERT_NE(cluster, nullptr);
  ShardProxy proxy(cluster->addresses[1]);
  ASSERT_NE(proxy.address(), "");
  ClientOptions o = Options(*cluster, 0, v1::CODEC_FP32);
  o.server_addresses[1] = proxy.address();
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Register(layout, Values(n, 4)).ok());
  ASSERT_TRUE((*c)->Step(Gradient(n, 0, 0)).ok());
  const std::vector<float> before((*c)->weights().begin(),
                                  (*c)->weights().end());
  ASSERT_EQ((*c)->step(), 1u);

  proxy.pull_failure = grpc::StatusCode::INTERNAL;
  const std::vector<float> g = Gradient(n, 0, 1);
  absl::Status s = (*c)->Step(g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("injected pull failure"));
  // Both shards completed the round, so shard 0's answer was there to apply.
  const ShardRange r0 = ShardRangeFor(n, kShards, 0);
  v1::GetStatusResponse st0 = cluster->shard(0)->Status();
  ASSERT_EQ(st0.current_step(), 2u);
  ASSERT_NE(ChecksumOf(absl::MakeConstSpan(before).subspan(r0.begin,
                                                           r0.size())),
            st0.replica_checksum());
  // Unchanged, byte for byte, and at the old step.
  EXPECT_EQ((*c)->step(), 1u);
  EXPECT_TRUE(BitEqual((*c)->weights(), before));

  proxy.pull_failure = 0;
  s = (*c)->Step(g);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ((*c)->step(), 2u);
  std::vector<float> expected(n);
  for (uint64_t i = 0; i < n; ++i) expected[i] = before[i] - g[i];
  EXPECT_TRUE(BitEqual((*c)->weights(), expected));
  EXPECT_EQ((*c)->stats().checksum_mismatches, 0u);
  for (uint32_t sh = 0; sh < kShards; ++sh) {
    v1::GetStatusResponse st = cluster->shard(sh)->Status();
    ShardRange r = ShardRangeFor(n, kShards, sh);
    EXPECT_EQ(ChecksumOf((*c)->weights().subspan(r.begin, r.size())),
              st.replica_checksum())
        << "shard " << sh;
  }
}

// The staging buffer itself: answers are invisible until every shard is
// staged and committed; a checksum mismatch stages nothing.
TEST(ClientReplica, StagedAnswersAreInvisibleUntilCommit) {
  Replica replica;
  replica.Reset(6, {{0, 4}, {4, 6}}, 7);
  auto snapshot = [](std::vector<float> v, uint64_t checksum) {
    v1::PullResponse r;
    r.set_kind(v1::PULL_KIND_SNAPSHOT);
    SetFp32(v, r.mutable_weights());
    r.set_replica_checksum(checksum);
    return r;
  };
  const std::vector<float> a = {1, 2, 3, 4}, b = {5, 6};
  replica.BeginUpdate();
  ASSERT_TRUE(replica.Stage(0, snapshot(a, ChecksumOf(a))).ok());
  EXPECT_EQ(replica.Stage(1, snapshot(b, ChecksumOf(b) + 1)).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_FALSE(replica.staged(1));
  EXPECT_TRUE(BitEqual(replica.weights(), std::vector<float>(6, 0.0f)));
  EXPECT_EQ(replica.step(), 7u);

  ASSERT_TRUE(replica.Stage(1, snapshot(b, ChecksumOf(b))).ok());
  replica.Commit(8);
  EXPECT_TRUE(BitEqual(replica.weights(), {1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(replica.step(), 8u);
  EXPECT_EQ(replica.checksum(1), ChecksumOf(b));

  // A delta adds to the committed slice; a mismatch leaves it alone.
  replica.BeginUpdate();
  v1::PullResponse d;
  d.set_kind(v1::PULL_KIND_DELTA);
  const std::vector<float> delta = {1, 1, 1, 1};
  SetFp32(delta, d.mutable_weights());
  const std::vector<float> a2 = {2, 3, 4, 5};
  d.set_replica_checksum(ChecksumOf(a2));
  ASSERT_TRUE(replica.Stage(0, d).ok());
  EXPECT_TRUE(BitEqual(replica.slice(0), a));
  ASSERT_TRUE(replica.Stage(1, snapshot(b, ChecksumOf(b))).ok());
  replica.Commit(9);
  EXPECT_TRUE(BitEqual(replica.slice(0), a2));
}

// A worker that stalls far longer than its lease (a starved host) finds the
// rounds many steps on when it pushes again: it rejoins and takes the
// rounds' current weights, instead of failing with "answered with step 20;
// expected 1" (seen in a fidelity run on an overloaded machine).
TEST(ClientRecovery, AWorkerDroppedManyRoundsAgoSkipsAheadToTheRounds) {
  auto cluster = StartLeasedCluster(2, 2, v1::CODEC_ONEBIT);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  auto stalled = Client::Connect(Options(*cluster, 0, v1::CODEC_ONEBIT));
  auto busy = Client::Connect(Options(*cluster, 1, v1::CODEC_ONEBIT));
  ASSERT_TRUE(stalled.ok() && busy.ok());
  ASSERT_TRUE((*stalled)->Register(layout, Values(n, 8)).ok());
  ASSERT_TRUE((*busy)->Register(layout, Values(n, 8)).ok());
  // Worker 0 says nothing; once its lease expires worker 1 goes on alone.
  constexpr int kSteps = 20;
  for (int t = 0; t < kSteps; ++t) {
    absl::Status st = (*busy)->Step(Gradient(n, 1, t));
    ASSERT_TRUE(st.ok()) << "step " << t << ": " << st;
  }
  ASSERT_EQ((*busy)->step(), static_cast<uint64_t>(kSteps));
  // Worker 0's push for step 0 is long over: it rejoins and skips ahead.
  absl::Status st = (*stalled)->Step(Gradient(n, 0, 0));
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ((*stalled)->step(), static_cast<uint64_t>(kSteps));
  EXPECT_GE((*stalled)->stats().rejoins, 2u);  // once per shard
  EXPECT_TRUE(BitEqual((*stalled)->weights(), (*busy)->weights()));
  for (uint32_t s = 0; s < 2; ++s) {
    ShardRange r = ShardRangeFor(n, 2, s);
    EXPECT_EQ(ChecksumOf((*stalled)->weights().subspan(r.begin, r.size())),
              cluster->shard(s)->Status().replica_checksum());
  }
}

}  // namespace
}  // namespace pserver
