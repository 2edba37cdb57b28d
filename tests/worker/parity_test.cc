// Distributed equals local: 2 real pserver_server processes and 4 real
// pserver_worker processes with the fp32 codec both ways and Adam end with
// exactly the weights of a single-process run of the same recipe (same
// seeds, gradients summed in worker order, mean = sum * (1/W)).
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/moment_optimizer.h"
#include "server/optimizer.h"
#include "tests/worker/process_util.h"
#include "worker/batcher.h"
#include "worker/idx_reader.h"
#include "worker/mlp.h"

namespace pserver {
namespace {

using testing::Process;

constexpr int kWorkers = 4;
constexpr int kShards = 2;
constexpr int kBatch = 32;
constexpr int kSteps = 40;
constexpr int kSubset = 4096;
constexpr uint64_t kSeed = 7;

std::vector<float> LocalRun() {
  SetBlasThreads(1);
  absl::StatusOr<Dataset> train =
      LoadFashionMnist(kFashionMnistDir, DataSplit::kTrain);
  EXPECT_TRUE(train.ok()) << train.status();
  train->size = kSubset;
  absl::StatusOr<Mlp> mlp = Mlp::Create({784, 256, 128, 10});
  std::vector<float> x = mlp->InitParams(kSeed);
  const uint64_t n = x.size();
  std::vector<Batcher> batchers;
  for (int w = 0; w < kWorkers; ++w) {
    batchers.push_back(*Batcher::Create(kSubset, kWorkers, w, kBatch, kSeed));
  }
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  c.lr = 1e-3f;
  c.bias_correction = true;  // the shards' default for --optimizer=adam
  MomentOptimizer opt(c, n, {{0, n}});
  std::vector<float> bx(kBatch * 784), acc(n), g(n);
  std::vector<uint8_t> by(kBatch);
  for (int step = 0; step < kSteps; ++step) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int w = 0; w < kWorkers; ++w) {
      GatherBatch(*train, batchers[w].WorkerBatch(step), bx.data(), by.data());
      mlp->LossAndGradient(x, bx.data(), by.data(), kBatch, absl::MakeSpan(g));
      for (uint64_t i = 0; i < n; ++i) acc[i] += g[i];
    }
    const float inv = 1.0f / kWorkers;
    for (uint64_t i = 0; i < n; ++i) acc[i] *= inv;
    opt.Step(acc, absl::MakeSpan(x));
  }
  return x;
}

TEST(Parity, DistributedEqualsLocalWithFp32AndAdam) {
  const std::string dir = testing::TempDir("parity");
  std::vector<std::unique_ptr<Process>> shards;
  std::string servers;
  for (int s = 0; s < kShards; ++s) {
    std::string port_file = absl::StrCat(dir, "/port", s);
    shards.push_back(std::make_unique<Process>(
        std::vector<std::string>{
            PSERVER_SERVER_BIN, absl::StrCat("--shard_index=", s),
            absl::StrCat("--num_shards=", kShards),
            absl::StrCat("--num_workers=", kWorkers), "--listen=127.0.0.1:0",
            "--metrics_listen=", "--optimizer=adam", "--lr=0.001",
            "--pull_codec=fp32", "--port_file=" + port_file},
        absl::StrCat(dir, "/shard", s, ".log")));
    int port = testing::ReadPortFile(port_file, std::chrono::seconds(20));
    ASSERT_GT(port, 0) << testing::ReadFile(absl::StrCat(dir, "/shard", s, ".log"));
    servers += absl::StrCat(s ? "," : "", "127.0.0.1:", port);
  }
  std::vector<std::unique_ptr<Process>> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.push_back(std::make_unique<Process>(
        std::vector<std::string>{
            PSERVER_WORKER_BIN, "--servers=" + servers,
            absl::StrCat("--worker_id=", w),
            absl::StrCat("--num_workers=", kWorkers),
            absl::StrCat("--steps=", kSteps),
            absl::StrCat("--batch_size=", kBatch),
            absl::StrCat("--seed=", kSeed),
            absl::StrCat("--train_subset=", kSubset), "--test_subset=500",
            "--push_codec=fp32", "--warmup_codec=fp32", "--blas_threads=1",
            "--progress=lines", "--log_interval=1000",
            absl::StrCat("--save_weights=", dir, "/w", w, ".bin")},
        absl::StrCat(dir, "/worker", w, ".log")));
  }
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_EQ(workers[w]->Wait(std::chrono::seconds(300)), 0)
        << testing::ReadFile(absl::StrCat(dir, "/worker", w, ".log"));
  }
  for (auto& s : shards) {
    s->Signal(SIGTERM);
    EXPECT_EQ(s->Wait(std::chrono::seconds(20)), 0);
  }
  std::string w0 = testing::ReadFile(dir + "/w0.bin");
  for (int w = 1; w < kWorkers; ++w) {
    EXPECT_EQ(testing::ReadFile(absl::StrCat(dir, "/w", w, ".bin")), w0)
        << "worker " << w << " holds different weights";
  }
  std::vector<float> local = LocalRun();
  ASSERT_EQ(w0.size(), local.size() * sizeof(float));
  size_t differ = 0;
  for (size_t i = 0; i < local.size(); ++i) {
    float d;
    std::memcpy(&d, w0.data() + i * 4, 4);
    if (std::memcmp(&d, &local[i], 4) != 0) ++differ;
  }
  EXPECT_EQ(differ, 0u) << "of " << local.size() << " weights";
  // And the run moved the weights at all.
  absl::StatusOr<Mlp> mlp = Mlp::Create({784, 256, 128, 10});
  std::vector<float> init = mlp->InitParams(kSeed);
  EXPECT_NE(0, std::memcmp(init.data(), local.data(), init.size() * 4));
}

}  // namespace
}  // namespace pserver
