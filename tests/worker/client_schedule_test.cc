// Workers and shards with a compression schedule (common/schedule.h), over
// real gRPC channels on loopback: the push codec follows the phase the
// shards announce, the pull codec the shard's phase, and a worker that
// registers mid-run pushes with the current phase's codec at once.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/layout.h"
#include "common/schedule.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/shard_server.h"
#include "tests/worker/client_test_util.h"
#include "worker/client.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;
using namespace testing_util;  // NOLINT: the shared test helpers

// Rounds 0-2 fp32 pushes, 3-5 8-bit quantize, then bf16 pushes and pulls.
constexpr char kSchedule[] = R"pb(
  phases { name: "exact" push { codec: "fp32" } }
  phases { name: "q8" begin_step: 3
           push { codec: "quantize" params { bits: 8 } } }
  phases { name: "half" begin_step: 6 push { codec: "bf16" }
           pull { codec: "bf16" } }
)pb";

std::unique_ptr<Cluster> StartScheduled(
    uint32_t shards, uint32_t workers,
    std::shared_ptr<const CompressionSchedule> schedule) {
  ShardConfig config;
  config.num_shards = shards;
  config.num_workers = workers;
  config.optimizer = ExactSgd();
  config.pull_codec = v1::CODEC_ONEBIT;
  config.schedule = std::move(schedule);
  return StartClusterWith(config);
}

TEST(ClientSchedule, EveryWorkerSwitchesCodecAtTheAnnouncedRound) {
  constexpr uint32_t kShards = 2, kWorkers = 2;
  constexpr int kSteps = 9;
  auto schedule = CompressionSchedule::Parse(kSchedule, "test");
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  auto cluster = StartScheduled(kShards, kWorkers, *schedule);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  const std::vector<float> init = Values(n, 8);
  // Per worker and step: push bytes and the phase before the push.
  std::vector<std::vector<uint64_t>> bytes(kWorkers);
  std::vector<std::vector<uint32_t>> phases(kWorkers);
  std::vector<std::vector<float>> final_weights(kWorkers);
  std::vector<absl::Status> status(kWorkers);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      ClientOptions o = Options(*cluster, w, v1::CODEC_ONEBIT);
      o.schedule = *schedule;
      auto c = Client::Connect(o);
      if (!c.ok()) {
        status[w] = c.status();
        return;
      }
      (*c)->SetRunLength(kSteps);
      status[w] = (*c)->Register(layout, init);
      for (int t = 0; t < kSteps && status[w].ok(); ++t) {
        phases[w].push_back((*c)->schedule_phase());
        const uint64_t before = (*c)->stats().push_payload_bytes;
        status[w] = (*c)->Step(Gradient(n, w, t));
        bytes[w].push_back((*c)->stats().push_payload_bytes - before);
      }
      final_weights[w].assign((*c)->weights().begin(), (*c)->weights().end());
    });
  }
  for (std::thread& t : threads) t.join();
  for (uint32_t w = 0; w < kWorkers; ++w) {
    ASSERT_TRUE(status[w].ok()) << "worker " << w << ": " << status[w];
    ASSERT_EQ(bytes[w].size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(phases[w],
              (std::vector<uint32_t>{0, 0, 0, 1, 1, 1, 2, 2, 2}));
    for (int t = 0; t < kSteps; ++t) {
      SCOPED_TRACE(absl::StrCat("worker ", w, " step ", t));
      if (t < 3) {
        EXPECT_EQ(bytes[w][t], 4 * n);  // fp32
      } else if (t < 6) {
        // 8-bit levels plus each block's range.
        EXPECT_GT(bytes[w][t], n);
        EXPECT_LT(bytes[w][t], 2 * n);
      } else {
        EXPECT_EQ(bytes[w][t], 2 * n);  // bf16
      }
    }
    EXPECT_TRUE(BitEqual(final_weights[w], final_weights[0]));
  }
  for (uint32_t s = 0; s < kShards; ++s) {
    ShardRange r = ShardRangeFor(n, kShards, s);
    EXPECT_EQ(ChecksumOf(absl::MakeConstSpan(final_weights[0])
                             .subspan(r.begin, r.size())),
              cluster->shard(s)->Status().replica_checksum());
  }

  // A worker that comes back now (a new process) is in the last phase from
  // its Register on.
  ClientOptions o = Options(*cluster, 1, v1::CODEC_ONEBIT);
  o.schedule = *schedule;
  auto late = Client::Connect(o);
  ASSERT_TRUE(late.ok()) << late.status();
  (*late)->SetRunLength(kSteps);
  ASSERT_TRUE((*late)->Register(layout, init).ok());
  EXPECT_EQ((*late)->step(), static_cast<uint64_t>(kSteps));
  EXPECT_EQ((*late)->schedule_phase(), 2u);

  // A worker without the schedule, or with another run length, is refused
  // with the shard's message.
  auto plain = Client::Connect(Options(*cluster, 1, v1::CODEC_ONEBIT));
  ASSERT_TRUE(plain.ok());
  absl::Status refused = (*plain)->Register(layout, init);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("schedule_fingerprint is"));
}

TEST(ClientSchedule, FractionsNeedTheRunLength) {
  auto schedule = CompressionSchedule::Parse(
      R"({"phases": [{}, {"begin_fraction": 0.5,
                           "push": {"codec": "bf16"}}]})",
      "test");
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  auto cluster = StartScheduled(1, 1, *schedule);
  ASSERT_NE(cluster, nullptr);
  ClientOptions o = Options(*cluster, 0, v1::CODEC_FP32);
  o.schedule = *schedule;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  absl::Status s = (*c)->Register(layout, Values(n, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("total_steps is 0"));
  (*c)->SetRunLength(4);
  ASSERT_TRUE((*c)->Register(layout, Values(n, 1)).ok());
  std::vector<uint64_t> bytes;
  for (int t = 0; t < 4; ++t) {
    const uint64_t before = (*c)->stats().push_payload_bytes;
    ASSERT_TRUE((*c)->Step(Gradient(n, 0, t)).ok());
    bytes.push_back((*c)->stats().push_payload_bytes - before);
  }
  EXPECT_EQ(bytes, (std::vector<uint64_t>{4 * n, 4 * n, 2 * n, 2 * n}));
}

}  // namespace
}  // namespace pserver
