// The chunked transport end to end (parameter_server.proto, "Chunks"): real
// in-process shards on loopback cut every push, pull and initial-weights
// installation into chunks of 1024 elements, several calls in flight per
// shard and worker at once. The arithmetic must not change: fp32 SGD gives
// x - mean(g) bit for bit, and a 1-bit run (blocks of 256 inside 1024-element
// chunks) ends bit-identical to the same run with one chunk per slice.
#include <cstdint>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util/test_helpers.h"
#include "tests/worker/client_test_util.h"
#include "worker/client.h"
#include "worker/ready_chunks.h"

namespace pserver {
namespace {

using testing_util::BitEqual;
using testing_util::Cluster;
using testing_util::ExactSgd;
using testing_util::Gradient;
using testing_util::Options;
using testing_util::StartCluster;
using testing_util::Values;

constexpr uint64_t kChunk = kMinChunkElements;  // 1024

// 3 tensors, 9001 elements: 2 shards of ~4500 = 5 chunks each, the last
// one short.
v1::ModelLayout ChunkyLayout() {
  v1::ModelLayout l;
  for (auto [name, size] : {std::pair{"a", 4000}, {"b", 3001}, {"c", 2000}}) {
    v1::TensorSpec* t = l.add_tensors();
    t->set_name(name);
    t->add_shape(size);
  }
  return l;
}

struct TrainResult {
  std::vector<std::vector<float>> weights;  // per worker, per step
  std::vector<ClientStats> stats;
};

// Trains `workers` clients for `steps` steps on one cluster, all at once.
TrainResult Train(Cluster& cluster, uint32_t workers, int steps, v1::Codec push,
          v1::Codec warmup) {
  const v1::ModelLayout layout = ChunkyLayout();
  const uint64_t n = TotalElements(layout);
  const std::vector<float> init = Values(n, 7);
  TrainResult run;
  run.weights.resize(static_cast<size_t>(workers) * (steps + 1));
  run.stats.resize(workers);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      auto client = Client::Connect(Options(cluster, w, push, warmup));
      ASSERT_TRUE(client.ok()) << client.status();
      absl::Status reg = (*client)->Register(layout, init);
      ASSERT_TRUE(reg.ok()) << "worker " << w << ": " << reg;
      auto keep = [&](int t) {
        run.weights[w * (steps + 1) + t].assign((*client)->weights().begin(),
                                                (*client)->weights().end());
      };
      keep(0);
      for (int t = 0; t < steps; ++t) {
        absl::Status s = (*client)->Step(Gradient(n, w, t));
        ASSERT_TRUE(s.ok()) << "worker " << w << " step " << t << ": " << s;
        keep(t + 1);
      }
      run.stats[w] = (*client)->stats();
    });
  }
  for (std::thread& t : threads) t.join();
  return run;
}

TEST(ClientChunks, Fp32SgdIsExactlyXMinusMeanGradientInChunks) {
  constexpr uint32_t kShards = 2, kWorkers = 3;
  constexpr int kSteps = 3;
  auto cluster =
      StartCluster(kShards, kWorkers, ExactSgd(), v1::CODEC_FP32, kChunk);
  ASSERT_NE(cluster, nullptr);
  const uint64_t n = TotalElements(ChunkyLayout());
  for (uint32_t s = 0; s < kShards; ++s) {
    ASSERT_EQ((ChunkPlan{ShardRangeFor(n, kShards, s).size(), kChunk}
                   .num_chunks()),
              5u);
  }
  TrainResult run = Train(*cluster, kWorkers, kSteps, v1::CODEC_FP32, v1::CODEC_FP32);
  std::vector<float> want = Values(n, 7);
  const float inv_w = 1.0f / kWorkers;
  for (int t = 0; t <= kSteps; ++t) {
    if (t > 0) {
      std::vector<float> acc(n, 0.0f);
      for (uint32_t w = 0; w < kWorkers; ++w) {
        std::vector<float> g = Gradient(n, w, t - 1);
        for (uint64_t i = 0; i < n; ++i) acc[i] += g[i];
      }
      for (uint64_t i = 0; i < n; ++i) want[i] -= acc[i] * inv_w;
    }
    for (uint32_t w = 0; w < kWorkers; ++w) {
      EXPECT_TRUE(BitEqual(run.weights[w * (kSteps + 1) + t], want))
          << "worker " << w << " step " << t;
    }
  }
  for (uint32_t w = 0; w < kWorkers; ++w) {
    EXPECT_EQ(run.stats[w].push_payload_bytes, kSteps * n * 4);
    EXPECT_EQ(run.stats[w].push_fp32_bytes, kSteps * n * 4);
    // The fp32 pull codec answers every step's pull with a snapshot;
    // Register's found the weights the worker registered with.
    EXPECT_EQ(run.stats[w].snapshots, kShards * kSteps);
  }
}

TEST(ClientChunks, OneBitRunEqualsTheOneChunkRun) {
  constexpr uint32_t kShards = 2, kWorkers = 2;
  constexpr int kSteps = 4;
  OptimizerConfig opt;
  opt.kind = OptimizerKind::kOneBitAdam;
  opt.freeze_step = 2;
  std::vector<std::vector<float>> finals;
  for (uint64_t chunk : {kChunk, kDefaultChunkElements}) {
    auto cluster =
        StartCluster(kShards, kWorkers, opt, v1::CODEC_ONEBIT, chunk);
    ASSERT_NE(cluster, nullptr);
    TrainResult run = Train(*cluster, kWorkers, kSteps, v1::CODEC_ONEBIT,
                    v1::CODEC_FP32);
    for (uint32_t w = 1; w < kWorkers; ++w) {
      EXPECT_TRUE(BitEqual(run.weights[w * (kSteps + 1) + kSteps],
                           run.weights[kSteps]));
    }
    for (uint32_t s = 0; s < kShards; ++s) {
      EXPECT_EQ(cluster->shard(s)->Status().stage(),
                v1::OPTIMIZER_STAGE_COMPRESSION);
    }
    finals.push_back(run.weights[kSteps]);
  }
  // Blocks of 256 never straddle a 1024-element chunk: same bytes, same run.
  EXPECT_TRUE(BitEqual(finals[0], finals[1]));
}

}  // namespace
}  // namespace pserver

namespace pserver {
namespace {

TEST(ReadyChunks, AChunkIsReadyOnceEveryElementWasHandedOver) {
  // Two shards of 10 elements in chunks of 4: [0,4) [4,8) [8,10) each.
  ReadyChunks r;
  r.Reset(20, {{0, 10}, {10, 20}}, {ChunkPlan{10, 4}, ChunkPlan{10, 4}});
  EXPECT_EQ(r.Take(0), -1);
  ASSERT_TRUE(r.Mark(14, 20).ok());  // shard 1: [4, 10) -> chunks 1, 2
  EXPECT_EQ(r.Take(1), 1);
  EXPECT_EQ(r.Take(1), 2);
  EXPECT_EQ(r.Take(1), -1);
  ASSERT_TRUE(r.Mark(2, 12).ok());  // shard 0 chunks 1, 2; shard 1 half of 0
  EXPECT_EQ(r.Take(0), 1);
  EXPECT_EQ(r.Take(0), 2);
  EXPECT_EQ(r.Take(1), -1);
  // Refused, nothing marked: overlap, empty, outside.
  for (auto [b, e] : {std::pair{11, 13}, {0, 3}, {5, 5}, {19, 21}}) {
    EXPECT_EQ(r.Mark(b, e).code(), absl::StatusCode::kInvalidArgument)
        << b << ".." << e;
  }
  using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
  EXPECT_EQ(r.Missing(), (Ranges{{0, 2}, {12, 14}}));
  ASSERT_TRUE(r.Mark(12, 14).ok());
  EXPECT_EQ(r.Take(1), 0);
  ASSERT_TRUE(r.Mark(0, 2).ok());
  EXPECT_EQ(r.Take(0), 0);
  EXPECT_TRUE(r.Missing().empty());
}

// The layout's tensors, as [begin, end) of the flat gradient.
std::vector<std::pair<uint64_t, uint64_t>> TensorRanges() {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  uint64_t at = 0;
  const v1::ModelLayout layout = ChunkyLayout();
  for (const v1::TensorSpec& t : layout.tensors()) {
    out.emplace_back(at, at + t.shape(0));
    at += t.shape(0);
  }
  return out;
}

TEST(ClientChunks, OverlappedStepsInBackwardOrderEqualStep) {
  constexpr uint32_t kShards = 2;
  constexpr int kSteps = 3;
  OptimizerConfig opt;
  opt.kind = OptimizerKind::kOneBitAdam;
  opt.freeze_step = 1;
  std::vector<std::vector<float>> finals;
  for (bool overlapped : {false, true}) {
    auto cluster = StartCluster(kShards, 1, opt, v1::CODEC_ONEBIT, kChunk);
    ASSERT_NE(cluster, nullptr);
    const v1::ModelLayout layout = ChunkyLayout();
    const uint64_t n = TotalElements(layout);
    auto client = Client::Connect(
        Options(*cluster, 0, v1::CODEC_ONEBIT, v1::CODEC_FP32));
    ASSERT_TRUE(client.ok());
    ASSERT_TRUE((*client)->Register(layout, Values(n, 7)).ok());
    for (int t = 0; t < kSteps; ++t) {
      const std::vector<float> g = Gradient(n, 0, t);
      if (!overlapped) {
        ASSERT_TRUE((*client)->Step(g).ok());
        continue;
      }
      // Backward fills the last tensor first: each is handed over when
      // "computed" (copied into the buffer the client reads).
      std::vector<float> grad(n, std::numeric_limits<float>::quiet_NaN());
      ASSERT_TRUE((*client)->StartStep(grad).ok());
      EXPECT_TRUE((*client)->in_step());
      auto ranges = TensorRanges();
      for (auto it = ranges.rbegin(); it != ranges.rend(); ++it) {
        std::copy(g.begin() + it->first, g.begin() + it->second,
                  grad.begin() + it->first);
        ASSERT_TRUE((*client)->GradientReady(it->first, it->second).ok());
      }
      ASSERT_TRUE((*client)->FinishStep().ok());
      EXPECT_FALSE((*client)->in_step());
    }
    finals.emplace_back((*client)->weights().begin(),
                        (*client)->weights().end());
  }
  EXPECT_TRUE(BitEqual(finals[0], finals[1]));
}

TEST(ClientChunks, OverlappedStepRefusesBadRangesAndKeepsTheStep) {
  auto cluster = StartCluster(1, 1, ExactSgd(), v1::CODEC_FP32, kChunk);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = ChunkyLayout();
  const uint64_t n = TotalElements(layout);
  auto client = Client::Connect(Options(*cluster, 0, v1::CODEC_FP32));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Register(layout, Values(n, 7)).ok());
  EXPECT_EQ((*client)->GradientReady(0, 1).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*client)->FinishStep().code(),
            absl::StatusCode::kFailedPrecondition);
  std::vector<float> grad = Gradient(n, 0, 0);
  grad[5000] = std::numeric_limits<float>::infinity();
  ASSERT_TRUE((*client)->StartStep(grad).ok());
  EXPECT_EQ((*client)->StartStep(grad).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*client)->Step(grad).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*client)->GradientReady(0, 1000).ok());
  EXPECT_EQ((*client)->GradientReady(500, 1500).code(),
            absl::StatusCode::kInvalidArgument);  // overlaps
  absl::Status inf = (*client)->GradientReady(4000, 6000);
  EXPECT_EQ(inf.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(inf.message().find("gradient[5000] is inf"), std::string::npos)
      << inf;
  // FinishStep refuses too, and the step stays open until the value is
  // fixed.
  EXPECT_EQ((*client)->FinishStep().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*client)->in_step());
  EXPECT_EQ((*client)->step(), 0u);
  grad[5000] = 0.5f;
  ASSERT_TRUE((*client)->FinishStep().ok());
  EXPECT_EQ((*client)->step(), 1u);
  // x - g exactly (one worker, SGD with lr 1).
  const std::vector<float> x0 = Values(n, 7);
  std::vector<float> want(n);
  for (uint64_t i = 0; i < n; ++i) want[i] = x0[i] - grad[i];
  EXPECT_TRUE(BitEqual((*client)->weights(), want));
}

// A client destroyed with an overlapped step open while its shard is gone
// (a Python optimizer collected after its shards stopped): the push thread
// gets the rest of the gradient and its calls are abandoned, so the
// destructor returns instead of retrying the dead shard for the whole
// retry budget (an hour here).
TEST(ClientChunks, DestroyedMidStepDoesNotRetryForTheRetryBudget) {
  auto cluster = StartCluster(1, 1, ExactSgd(), v1::CODEC_FP32, kChunk);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = ChunkyLayout();
  const uint64_t n = TotalElements(layout);
  ClientOptions o = Options(*cluster, 0, v1::CODEC_FP32);
  o.rpc_timeout = absl::Milliseconds(200);
  o.retry_budget = absl::Hours(1);
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Register(layout, Values(n, 7)).ok());
  std::vector<float> grad = Gradient(n, 0, 0);
  ASSERT_TRUE((*client)->StartStep(grad).ok());
  ASSERT_TRUE((*client)->GradientReady(0, 1000).ok());
  cluster->servers[0].reset();  // the shard stops
  const absl::Time start = absl::Now();
  client->reset();
  EXPECT_LT(absl::Now() - start, absl::Minutes(6))
      << "the destructor waited for the retry budget";
}

}  // namespace
}  // namespace pserver
