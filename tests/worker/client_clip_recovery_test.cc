// Clipping the round's mean (PushRequest.clip_norm) through a shard that
// restarts while the round waits for its norm: the worker's norm pull is
// refused by the restarted shard (it lost this worker and the round), the
// worker rejoins and pushes the step again, as a refused push is
// recovered (worker/recovery.h), and asks for the norm again; the round
// then steps on the clipped mean as if nothing had happened.
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/layout.h"
#include "gtest/gtest.h"
#include "server/shard_server.h"
#include "tests/worker/client_test_util.h"
#include "worker/client.h"

namespace pserver {
namespace {

using namespace testing_util;  // NOLINT: the shared test helpers

constexpr float kClip = 0.5f;

// x - clip(mean(g0, g1)) for exact SGD (lr 1), with the shards' coefficient:
// the squared norm of the mean summed over the shards' ranges in order.
std::vector<float> ClippedStep(const std::vector<float>& x,
                               const std::vector<float>& g0,
                               const std::vector<float>& g1,
                               uint32_t shards) {
  const uint64_t n = x.size();
  std::vector<float> mean(n);
  for (uint64_t i = 0; i < n; ++i) mean[i] = (g0[i] + g1[i]) / 2;
  double total = 0;
  for (uint32_t s = 0; s < shards; ++s) {
    const ShardRange r = ShardRangeFor(n, shards, s);
    double part = 0;
    for (uint64_t i = r.begin; i < r.end; ++i) {
      part += static_cast<double>(mean[i]) * mean[i];
    }
    total += part;
  }
  const double coef = std::min(1.0, kClip / (std::sqrt(total) + 1e-6));
  EXPECT_LT(coef, 1.0) << "the step must clip";
  std::vector<float> out(n);
  for (uint64_t i = 0; i < n; ++i) {
    out[i] = x[i] - static_cast<float>(mean[i] * coef);
  }
  return out;
}

// fp32 chunks are encoded again for the resend; bf16 ones (exact here:
// the values are multiples of 1/64) are resent as kept, which must carry
// the round's clip_norm too.
class ClientClipRecovery : public ::testing::TestWithParam<v1::Codec> {};

TEST_P(ClientClipRecovery, AShardRestartedWhileTheRoundWaitsForItsNorm) {
  constexpr uint32_t kShards = 2;
  auto cluster = StartCluster(kShards, 2, ExactSgd(), v1::CODEC_FP32);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  std::vector<std::unique_ptr<Client>> w;
  for (uint32_t id = 0; id < 2; ++id) {
    ClientOptions o = Options(*cluster, id, GetParam(), GetParam());
    o.rpc_timeout = o.pull_timeout = o.retry_budget = absl::Seconds(60);
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->Register(layout, Values(n, 8)).ok());
    ASSERT_TRUE((*c)->SetClipNorm(kClip).ok());
    w.push_back(std::move(c).value());
  }
  StepBoth(*w[0], *w[1], n, 0);
  const std::vector<float> before(w[0]->weights().begin(),
                                  w[0]->weights().end());

  // Worker 0 pushes step 1 to both shards, which hold nothing yet (worker
  // 1 has not pushed): its norm pulls wait.
  absl::Status s0;
  std::thread first([&] { s0 = w[0]->Step(Gradient(n, 0, 1)); });
  for (uint32_t s = 0; s < kShards; ++s) {
    const absl::Time until = absl::Now() + absl::Seconds(30);
    while (cluster->shard(s)->Status().pushes_pending() < 1 &&
           absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_EQ(cluster->shard(s)->Status().pushes_pending(), 1u);
  }
  // Past the pushes' acknowledgements.
  absl::SleepFor(absl::Milliseconds(300));

  // Shard 1 stops and comes back on its port with nothing (no checkpoint).
  const int port = cluster->servers[1]->port();
  cluster->servers[1]->Shutdown(absl::ZeroDuration());
  cluster->servers[1].reset();
  auto restarted = StartShard(cluster->config, 1, port, nullptr);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  cluster->servers[1] = std::move(restarted).value();

  const absl::Status s1 = w[1]->Step(Gradient(n, 1, 1));
  first.join();
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  EXPECT_GE(w[0]->stats().rejoins, 1u);
  const std::vector<float> want =
      ClippedStep(before, Gradient(n, 0, 1), Gradient(n, 1, 1), kShards);
  for (const auto& c : w) {
    ASSERT_EQ(c->step(), 2u);
    for (uint64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(c->weights()[i], want[i], 1e-6f) << "element " << i;
    }
  }
  // And on from there.
  StepBoth(*w[0], *w[1], n, 2);
}

INSTANTIATE_TEST_SUITE_P(Codecs, ClientClipRecovery,
                         ::testing::Values(v1::CODEC_FP32, v1::CODEC_BF16));

}  // namespace
}  // namespace pserver
