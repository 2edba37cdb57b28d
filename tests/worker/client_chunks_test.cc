// The chunked transport end to end (parameter_server.proto, "Chunks"): real
// in-process shards on loopback cut every push, pull and initial-weights
// installation into chunks of 1024 elements, several calls in flight per
// shard and worker at once. The arithmetic must not change: fp32 SGD gives
// x - mean(g) bit for bit, and a 1-bit run (blocks of 256 inside 1024-element
// chunks) ends bit-identical to the same run with one chunk per slice.
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util/test_helpers.h"
#include "tests/worker/client_test_util.h"
#include "worker/client.h"

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
    // The fp32 pull codec answers every pull with a snapshot.
    EXPECT_EQ(run.stats[w].snapshots, kShards * (kSteps + 1));
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
