// The worker's training loop (worker/trainer.h) against a real in-process
// shard: one loop for every workload, so the synthetic model keeps its
// error-feedback residuals across a restart exactly as the MLP does.
#include "worker/trainer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "tune/gradient_file.h"
#include "common/layout.h"
#include "gtest/gtest.h"
#include "server/shard_server.h"
#include "tests/test_util/temp_dir.h"
#include "worker/client.h"
#include "worker/workloads.h"

namespace pserver {
namespace {

// A shard of `config` for one worker on a loopback port, or null (the test
// fails).
std::unique_ptr<ShardServer> StartSoloShard(ShardConfig config) {
  config.num_shards = 1;
  config.num_workers = 1;
  ServerOptions so;
  so.listen_address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<ShardServer>> server =
      ShardServer::Start(config, so, nullptr);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// The options of that shard's one worker, pushing with `push`.
ClientOptions SoloClientOptions(const ShardServer& server, v1::Codec push) {
  ClientOptions c;
  c.server_addresses = {absl::StrCat("127.0.0.1:", server.port())};
  c.push_codec = push;
  c.rpc_timeout = c.pull_timeout = c.retry_budget = absl::Seconds(10);
  return c;
}

// Before issue 9 the synthetic model had its own loop that never read or
// wrote --state_file: a restarted synthetic worker lost its residuals, and
// no file was ever written. Now the first run saves them at its last step
// and a restarted worker (same id, new Client) loads them after Register.
TEST(Trainer, Issue9SyntheticModelSavesAndReloadsResiduals) {
  ShardConfig config;
  config.optimizer.kind = OptimizerKind::kAdam;  // compresses every step
  std::unique_ptr<ShardServer> server = StartSoloShard(config);
  ASSERT_NE(server, nullptr);

  const std::string dir = testing_util::MakeTempDir("trainer_test");
  ASSERT_FALSE(dir.empty());
  TrainerOptions t;
  t.model = "synthetic";
  t.synthetic_params = 1000;
  t.synthetic_tensors = 2;
  t.steps = 5;
  t.state_file = dir + "/worker0.state";
  t.state_every = 100;  // only the final save
  ClientOptions c = SoloClientOptions(*server, v1::CODEC_ONEBIT);

  auto first = Client::Connect(c);
  ASSERT_TRUE(first.ok());
  absl::StatusOr<TrainResult> r1 =
      RunTraining(t, first->get(), nullptr, nullptr, 0, 1);
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r1->steps, 5);
  EXPECT_EQ((*first)->step(), 5u);
  const double residual = (*first)->ResidualNorm();
  ASSERT_GT(residual, 0.0);
  ASSERT_TRUE(std::filesystem::exists(t.state_file));

  // The restarted worker: the shard is at step 5, so nothing more to train;
  // the residuals come back from the file, bit for bit (same norm).
  auto second = Client::Connect(c);
  ASSERT_TRUE(second.ok());
  absl::StatusOr<TrainResult> r2 =
      RunTraining(t, second->get(), nullptr, nullptr, 0, 1);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ((*second)->step(), 5u);
  // The loaded residual's norm is a pass in double, the saved one summed
  // by the 1-bit kernel in float lanes (error_feedback.h): ~1e-7 apart.
  EXPECT_NEAR((*second)->ResidualNorm(), residual, 1e-6 * residual);

  // And it trains on from there and saves again at its new last step: a
  // third incarnation loads the residuals of step 7, not those of step 5.
  t.steps = 7;
  absl::StatusOr<TrainResult> r3 =
      RunTraining(t, second->get(), nullptr, nullptr, 0, 1);
  ASSERT_TRUE(r3.ok()) << r3.status();
  EXPECT_EQ((*second)->step(), 7u);
  auto third = Client::Connect(c);
  ASSERT_TRUE(third.ok());
  ASSERT_TRUE(RunTraining(t, third->get(), nullptr, nullptr, 0, 1).ok());
  EXPECT_NEAR((*third)->ResidualNorm(), (*second)->ResidualNorm(),
              1e-6 * (*second)->ResidualNorm());

  server->Shutdown(absl::Seconds(1));
  std::filesystem::remove_all(dir);
}

// The per-step record behind the worker's summary JSON (step_seconds,
// step_push_bytes, step_pull_bytes; tests/bench/network.sh reads them): one
// entry per step, in order, whose byte counts add up to the client's totals.
TEST(Trainer, StepLogHasOneEntryPerStepAddingUpToTheClientTotals) {
  ShardConfig config;
  config.optimizer.kind = OptimizerKind::kAdam;  // the push codec every step
  std::unique_ptr<ShardServer> server = StartSoloShard(config);
  ASSERT_NE(server, nullptr);
  TrainerOptions t;
  t.model = "synthetic";
  t.synthetic_params = 4096;
  t.synthetic_tensors = 2;
  t.steps = 6;
  ClientOptions c = SoloClientOptions(*server, v1::CODEC_ONEBIT);
  auto client = Client::Connect(c);
  ASSERT_TRUE(client.ok());
  const ClientStats before = (*client)->stats();
  absl::StatusOr<TrainResult> r =
      RunTraining(t, client->get(), nullptr, nullptr, 0, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->step_log.size(), 6u);
  uint64_t pushed = 0, pulled = 0;
  double seconds = 0;
  for (const StepRecord& s : r->step_log) {
    EXPECT_GT(s.seconds, 0.0);
    // A 1-bit push of a fixed layout has the same size every step.
    EXPECT_EQ(s.push_bytes, r->step_log[0].push_bytes);
    EXPECT_GT(s.push_bytes, 0u);
    EXPECT_GT(s.pull_bytes, 0u);
    pushed += s.push_bytes;
    pulled += s.pull_bytes;
    seconds += s.seconds;
  }
  // 4096 parameters as 1 bit each plus block scales: far below fp32.
  EXPECT_LT(r->step_log[0].push_bytes, 4096u * 4 / 8);
  // Registration pulled nothing (the shard holds the weights the trainer
  // registered with): every byte is in one of the steps.
  EXPECT_EQ(pushed, r->stats.push_payload_bytes - before.push_payload_bytes);
  EXPECT_EQ(pulled, r->stats.pull_payload_bytes - before.pull_payload_bytes);
  EXPECT_LE(seconds, r->wall_seconds);
  server->Shutdown(absl::Seconds(1));
}

// Local steps (DiLoCo) with an outer optimizer that just takes the average
// (sgd, lr 1, no momentum) and fp32 both ways: one worker's rounds reproduce
// H x rounds steps of its own Adam, one push and one pull per round.
TEST(Trainer, LocalStepsPushTheWeightChangeOncePerRound) {
  ShardConfig config;
  config.optimizer.kind = OptimizerKind::kSgd;
  config.optimizer.lr = 1.0f;
  config.optimizer.momentum = 0.0f;
  config.pull_codec = v1::CODEC_FP32;
  std::unique_ptr<ShardServer> server = StartSoloShard(config);
  ASSERT_NE(server, nullptr);
  TrainerOptions t;
  t.model = "synthetic";
  t.synthetic_params = 3000;
  t.synthetic_tensors = 3;
  t.steps = 10;  // rounds of 4, 4 and 2 local steps
  t.local_steps = 4;
  t.inner.lr = 0.01f;
  ClientOptions c = SoloClientOptions(*server, v1::CODEC_FP32);
  c.local_steps = 4;
  auto client = Client::Connect(c);
  ASSERT_TRUE(client.ok());
  absl::StatusOr<TrainResult> r =
      RunTraining(t, client->get(), nullptr, nullptr, 0, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*client)->step(), 3u);  // the shard counts rounds
  ASSERT_EQ(r->step_log.size(), 3u);
  for (const StepRecord& s : r->step_log) EXPECT_EQ(s.push_bytes, 3000u * 4);

  // The same 10 steps of Adam in this process.
  auto model = MakeSyntheticWorkload(t, 0);
  ASSERT_TRUE(model.ok());
  std::vector<float> x = (*model)->InitialWeights(), g(x.size());
  InnerAdam adam(t.inner, x.size());
  for (int64_t step = 0; step < 10; ++step) {
    ASSERT_TRUE((*model)->Gradient(step, x, absl::MakeSpan(g)).ok());
    adam.Step(g, absl::MakeSpan(x));
  }
  absl::Span<const float> w = (*client)->weights();
  ASSERT_EQ(w.size(), x.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    worst = std::max(worst, std::abs(double{w[i]} - x[i]));
  }
  // x - 1 * (x - local) rounds once per round.
  EXPECT_LT(worst, 1e-6);
  EXPECT_GT(std::abs(double{w[0]} - (*model)->InitialWeights()[0]), 1e-4);
  server->Shutdown(absl::Seconds(1));
}

TEST(Trainer, LocalStepsAndInnerOptionsAreChecked) {
  ClientOptions c;
  c.server_addresses = {"127.0.0.1:1"};
  auto client = Client::Connect(c);
  ASSERT_TRUE(client.ok());
  TrainerOptions t;
  t.model = "synthetic";
  t.local_steps = 0;
  absl::StatusOr<TrainResult> r =
      RunTraining(t, client->get(), nullptr, nullptr, 0, 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("local_steps is 0; expected 1..100000"),
            std::string::npos) << r.status();
  t.local_steps = 8;
  t.inner.lr = 0;
  r = RunTraining(t, client->get(), nullptr, nullptr, 0, 1);
  EXPECT_NE(r.status().message().find("inner_lr is 0"), std::string::npos)
      << r.status();
}

TEST(Trainer, UnknownModelIsRefusedNamingTheChoices) {
  ClientOptions c;
  c.server_addresses = {"127.0.0.1:1"};
  auto client = Client::Connect(c);
  ASSERT_TRUE(client.ok());
  TrainerOptions t;
  t.model = "resnet";
  absl::StatusOr<TrainResult> r =
      RunTraining(t, client->get(), nullptr, nullptr, 0, 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("expected mlp or synthetic"),
            std::string::npos);
}

// Issue 13: --capture_gradients keeps the raw gradient of exactly the
// requested steps (the workload's own gradient, not what error feedback and
// 1-bit compression made of it), under the model's layout and worker id.
TEST(Trainer, CapturesTheRawGradientsOfTheRequestedSteps) {
  ShardConfig config;
  config.optimizer.kind = OptimizerKind::kAdam;
  std::unique_ptr<ShardServer> server = StartSoloShard(config);
  ASSERT_NE(server, nullptr);
  const std::string dir = testing_util::MakeTempDir("trainer_test");
  TrainerOptions t;
  t.model = "synthetic";
  t.synthetic_params = 1000;
  t.synthetic_tensors = 2;
  t.steps = 6;
  t.capture_file = dir + "/grads.bin";
  absl::StatusOr<StepRanges> ranges = StepRanges::Parse("1-2,4,9");
  ASSERT_TRUE(ranges.ok());
  t.capture_steps = *ranges;
  ClientOptions c = SoloClientOptions(*server, v1::CODEC_ONEBIT);
  auto client = Client::Connect(c);
  ASSERT_TRUE(client.ok());
  absl::StatusOr<TrainResult> r =
      RunTraining(t, client->get(), nullptr, nullptr, 0, 1);
  ASSERT_TRUE(r.ok()) << r.status();

  absl::StatusOr<GradientCapture> got = ReadGradientFile(t.capture_file);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->worker_id, 0u);
  auto model = MakeSyntheticWorkload(t, 0);
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(FirstLayoutDifference(got->layout, (*model)->layout()), "");
  ASSERT_EQ(got->steps.size(), 3u);  // step 9 is past the run's end
  std::vector<float> weights(1000), want(1000);
  for (size_t i = 0; i < 3; ++i) {
    const int64_t step = std::vector<int64_t>{1, 2, 4}[i];
    EXPECT_EQ(got->steps[i].step, static_cast<uint64_t>(step));
    ASSERT_TRUE((*model)->Gradient(step, weights, absl::MakeSpan(want)).ok());
    EXPECT_EQ(got->steps[i].values, want) << "step " << step;
  }
  EXPECT_NE(got->steps[0].values, got->steps[1].values);

  // A file that cannot be created ends the run before the first step.
  t.capture_file = dir + "/missing/grads.bin";
  auto other = Client::Connect(c);
  ASSERT_TRUE(other.ok());
  r = RunTraining(t, other->get(), nullptr, nullptr, 0, 1);
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("missing/grads.bin"), std::string::npos);
}

// With local steps the capture counts local steps: each of a round's inner
// gradients is the workload's own, not the round's weight change.
TEST(Trainer, CaptureWithLocalStepsKeepsEachInnerGradient) {
  ShardConfig config;
  config.optimizer.kind = OptimizerKind::kSgd;
  config.pull_codec = v1::CODEC_FP32;
  std::unique_ptr<ShardServer> server = StartSoloShard(config);
  ASSERT_NE(server, nullptr);
  const std::string dir = testing_util::MakeTempDir("trainer_test");
  TrainerOptions t;
  t.model = "synthetic";
  t.synthetic_params = 300;
  t.synthetic_tensors = 3;
  t.steps = 6;  // rounds of 2 local steps
  t.local_steps = 2;
  t.capture_file = dir + "/grads.bin";
  absl::StatusOr<StepRanges> ranges = StepRanges::Parse("1-4");
  ASSERT_TRUE(ranges.ok());
  t.capture_steps = *ranges;
  ClientOptions c = SoloClientOptions(*server, v1::CODEC_FP32);
  c.local_steps = 2;
  auto client = Client::Connect(c);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE(RunTraining(t, client->get(), nullptr, nullptr, 0, 1).ok());

  absl::StatusOr<GradientCapture> got = ReadGradientFile(t.capture_file);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->steps.size(), 4u);
  auto model = MakeSyntheticWorkload(t, 0);
  ASSERT_TRUE(model.ok());
  std::vector<float> weights(300), want(300);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(got->steps[i].step, i + 1);
    ASSERT_TRUE((*model)->Gradient(i + 1, weights, absl::MakeSpan(want)).ok());
    EXPECT_EQ(got->steps[i].values, want) << "step " << i + 1;
  }
  server->Shutdown(absl::Seconds(1));
}

// Weight deltas for pserver_tune --deltas: the change of the replica over
// each captured step, so that those of every step add up to the run's.
TEST(Trainer, CapturesTheWeightDeltasOfTheRequestedSteps) {
  ShardConfig config;
  config.optimizer.kind = OptimizerKind::kAdam;
  config.pull_codec = v1::CODEC_FP32;
  std::unique_ptr<ShardServer> server = StartSoloShard(config);
  ASSERT_NE(server, nullptr);
  const std::string dir = testing_util::MakeTempDir("trainer_test");
  TrainerOptions t;
  t.model = "synthetic";
  t.synthetic_params = 500;
  t.synthetic_tensors = 2;
  t.steps = 5;
  t.capture_deltas_file = dir + "/deltas.bin";
  absl::StatusOr<StepRanges> ranges = StepRanges::Parse("0-4");
  ASSERT_TRUE(ranges.ok());
  t.capture_steps = *ranges;
  ClientOptions c = SoloClientOptions(*server, v1::CODEC_FP32);
  auto client = Client::Connect(c);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE(RunTraining(t, client->get(), nullptr, nullptr, 0, 1).ok());

  absl::StatusOr<GradientCapture> got = ReadGradientFile(t.capture_deltas_file);
  ASSERT_TRUE(got.ok()) << got.status();
  auto model = MakeSyntheticWorkload(t, 0);
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(FirstLayoutDifference(got->layout, (*model)->layout()), "");
  ASSERT_EQ(got->steps.size(), 5u);
  const std::vector<float> initial = (*model)->InitialWeights();
  absl::Span<const float> final_weights = (*client)->weights();
  std::vector<double> sum(500, 0.0);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(got->steps[i].step, i);
    double norm = 0;
    for (size_t k = 0; k < 500; ++k) {
      sum[k] += got->steps[i].values[k];
      norm += std::abs(got->steps[i].values[k]);
    }
    EXPECT_GT(norm, 0.0) << "step " << i;
  }
  for (size_t k = 0; k < 500; ++k) {
    ASSERT_NEAR(initial[k] + sum[k], final_weights[k], 1e-5) << "element " << k;
  }

  // Not with local steps: their rounds are not steps.
  t.local_steps = 2;
  auto other = Client::Connect(c);
  ASSERT_TRUE(other.ok());
  absl::StatusOr<TrainResult> r =
      RunTraining(t, other->get(), nullptr, nullptr, 0, 1);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  server->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace pserver
