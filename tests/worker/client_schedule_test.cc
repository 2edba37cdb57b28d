// Workers and shards with a compression schedule (common/schedule.h), over
// real gRPC channels on loopback: the push codec follows the phase the
// shards announce, the pull codec the shard's phase, and a worker that
// registers mid-run pushes with the current phase's codec at once.
#include <algorithm>
#include <map>
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

// What one worker of RunWorkers saw.
struct WorkerRun {
  absl::Status status;
  std::vector<uint32_t> phases;      // the schedule phase before each step
  std::vector<uint64_t> push_bytes;  // payload bytes pushed in each step
  std::vector<uint64_t> pull_bytes;  // and pulled
  std::vector<float> weights;        // after the last step
};

// `workers` clients of `cluster` with `schedule` and the push codec flag
// `push`, each in a thread of its own: Register `init` under TestLayout()
// for a run of `steps` rounds, then `steps` steps of Gradient().
std::vector<WorkerRun> RunWorkers(
    const Cluster& cluster, uint32_t workers,
    const std::shared_ptr<const CompressionSchedule>& schedule,
    v1::Codec push, const std::vector<float>& init, int steps) {
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  std::vector<WorkerRun> runs(workers);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      WorkerRun& run = runs[w];
      ClientOptions o = Options(cluster, w, push);
      o.schedule = schedule;
      auto c = Client::Connect(o);
      if (!c.ok()) {
        run.status = c.status();
        return;
      }
      (*c)->SetRunLength(steps);
      run.status = (*c)->Register(layout, init);
      for (int t = 0; t < steps && run.status.ok(); ++t) {
        run.phases.push_back((*c)->schedule_phase());
        const ClientStats before = (*c)->stats();
        run.status = (*c)->Step(Gradient(n, w, t));
        run.push_bytes.push_back((*c)->stats().push_payload_bytes -
                                 before.push_payload_bytes);
        run.pull_bytes.push_back((*c)->stats().pull_payload_bytes -
                                 before.pull_payload_bytes);
      }
      run.weights.assign((*c)->weights().begin(), (*c)->weights().end());
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

// Every shard's replica checksum is that of its slice of `weights`.
void ExpectShardsHold(Cluster& cluster, uint32_t shards,
                      const std::vector<float>& weights) {
  for (uint32_t s = 0; s < shards; ++s) {
    const ShardRange r = ShardRangeFor(weights.size(), shards, s);
    EXPECT_EQ(
        ChecksumOf(absl::MakeConstSpan(weights).subspan(r.begin, r.size())),
        cluster.shard(s)->Status().replica_checksum())
        << "shard " << s;
  }
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
  const std::vector<WorkerRun> runs =
      RunWorkers(*cluster, kWorkers, *schedule, v1::CODEC_ONEBIT, init, kSteps);
  for (uint32_t w = 0; w < kWorkers; ++w) {
    const WorkerRun& run = runs[w];
    ASSERT_TRUE(run.status.ok()) << "worker " << w << ": " << run.status;
    ASSERT_EQ(run.push_bytes.size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(run.phases,
              (std::vector<uint32_t>{0, 0, 0, 1, 1, 1, 2, 2, 2}));
    for (int t = 0; t < kSteps; ++t) {
      SCOPED_TRACE(absl::StrCat("worker ", w, " step ", t));
      if (t < 3) {
        EXPECT_EQ(run.push_bytes[t], 4 * n);  // fp32
      } else if (t < 6) {
        // 8-bit levels plus each block's range.
        EXPECT_GT(run.push_bytes[t], n);
        EXPECT_LT(run.push_bytes[t], 2 * n);
      } else {
        EXPECT_EQ(run.push_bytes[t], 2 * n);  // bf16
      }
    }
    EXPECT_TRUE(BitEqual(run.weights, runs[0].weights));
  }
  ExpectShardsHold(*cluster, kShards, runs[0].weights);

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

// Per-tensor codecs: b is pushed exactly and pulled in bf16, c pushed in
// 4-bit; the rest take the phase's onebit pushes and the shards' onebit
// pulls. With one chunk per shard, every push and pull chunk holds pieces of
// several tensors (CODEC_SEGMENTS).
constexpr char kPerTensor[] = R"pb(
  phases {
    name: "tuned"
    push { codec: "onebit" }
    tensors { tensor: "b" push { codec: "fp32" } pull { codec: "bf16" } }
    tensors { tensor: "c" push { codec: "quantize" params { bits: 4 } } }
  }
)pb";

// Payload bytes of slice r of TestLayout encoded per tensor: `codecs` by
// tensor name, `fallback` for the others; neighbouring tensors of the same
// codec are encoded as one piece.
uint64_t PieceBytes(const std::vector<TensorSlot>& slots, ShardRange r,
                    const std::map<std::string, const Codec*>& codecs,
                    const Codec& fallback) {
  std::vector<std::pair<uint64_t, const Codec*>> pieces;  // length, codec
  for (const TensorSlot& t : slots) {
    const uint64_t b = std::max(t.offset, r.begin);
    const uint64_t e = std::min(t.offset + t.size, r.end);
    if (b >= e) continue;
    auto it = codecs.find(t.name);
    const Codec* c = it != codecs.end() ? it->second : &fallback;
    if (!pieces.empty() && pieces.back().second == c) {
      pieces.back().first += e - b;
    } else {
      pieces.emplace_back(e - b, c);
    }
  }
  uint64_t bytes = 0;
  for (const auto& [length, c] : pieces) {
    std::vector<float> v = Values(length, length);
    v1::EncodedTensor out;
    EXPECT_TRUE(c->Encode(v, 1, &out).ok());
    bytes += out.payload().size();
  }
  return bytes;
}

TEST(ClientSchedule, PerTensorCodecsPushAndPullEachTensorWithItsOwn) {
  constexpr uint32_t kShards = 2, kWorkers = 2;
  constexpr int kSteps = 4;
  auto schedule = CompressionSchedule::Parse(kPerTensor, "tuned.txtpb");
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  auto cluster = StartScheduled(kShards, kWorkers, *schedule);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  const std::vector<float> init = Values(n, 8);
  // The workers' push codec flag is not the phase's onebit.
  const std::vector<WorkerRun> runs =
      RunWorkers(*cluster, kWorkers, *schedule, v1::CODEC_TOPK, init, kSteps);

  absl::StatusOr<std::vector<TensorSlot>> slots = ValidateLayout(layout);
  ASSERT_TRUE(slots.ok());
  auto onebit = MakeCodec(v1::CODEC_ONEBIT, {});
  auto fp32 = MakeCodec(v1::CODEC_FP32, {});
  auto bf16 = MakeCodec(v1::CODEC_BF16, {});
  v1::CodecParams q4_params;
  q4_params.set_bits(4);
  auto q4 = MakeCodec(v1::CODEC_QUANTIZE, q4_params);
  uint64_t want_push = 0, want_pull = 0;
  for (uint32_t s = 0; s < kShards; ++s) {
    const ShardRange r = ShardRangeFor(n, kShards, s);
    want_push += PieceBytes(*slots, r, {{"b", fp32->get()}, {"c", q4->get()}},
                            **onebit);
    want_pull += PieceBytes(*slots, r, {{"b", bf16->get()}}, **onebit);
  }
  // Not what a single codec would send.
  ASSERT_NE(want_push, OneBitBytes(ShardRangeFor(n, kShards, 0).size()) +
                           OneBitBytes(ShardRangeFor(n, kShards, 1).size()));
  for (uint32_t w = 0; w < kWorkers; ++w) {
    const WorkerRun& run = runs[w];
    ASSERT_TRUE(run.status.ok()) << "worker " << w << ": " << run.status;
    ASSERT_EQ(run.push_bytes.size(), static_cast<size_t>(kSteps));
    for (int t = 0; t < kSteps; ++t) {
      SCOPED_TRACE(absl::StrCat("worker ", w, " step ", t));
      EXPECT_EQ(run.push_bytes[t], want_push);
      // Every step's pull is a delta of the per-tensor pull codecs (the
      // replica checksums after each pull prove the worker decoded the
      // segments to the shard's x_hat bit for bit).
      EXPECT_EQ(run.pull_bytes[t], want_pull);
    }
    EXPECT_TRUE(BitEqual(run.weights, runs[0].weights));
  }
  ExpectShardsHold(*cluster, kShards, runs[0].weights);
}

TEST(ClientSchedule, PerTensorCodecsNeedTheTensorsAndCompressedPulls) {
  auto schedule = CompressionSchedule::Parse(
      R"({"phases": [{"tensors": [{"tensor": "zz",
                                   "push": {"codec": "fp32"}}]}]})",
      "typo.json");
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  auto cluster = StartScheduled(1, 1, *schedule);
  ASSERT_NE(cluster, nullptr);
  const v1::ModelLayout layout = TestLayout();
  const uint64_t n = TotalElements(layout);
  // The worker refuses before it registers anywhere.
  ClientOptions o = Options(*cluster, 0, v1::CODEC_ONEBIT);
  o.schedule = *schedule;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  absl::Status s = (*c)->Register(layout, Values(n, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor \"zz\" is not in the model's "
                                     "layout; expected one of a, b, c, d"));
  // The shard too (a client of another build): FAILED_PRECONDITION, and
  // nothing installed.
  v1::RegisterRequest req;
  req.set_worker_id(0);
  req.set_num_workers(1);
  req.set_shard_index(0);
  req.set_num_shards(1);
  *req.mutable_layout() = layout;
  req.set_schedule_fingerprint((*schedule)->fingerprint());
  std::vector<float> init = Values(n, 1);
  v1::EncodedTensor* w = req.mutable_initial_weights();
  w->set_codec(v1::CODEC_FP32);
  w->set_num_elements(n);
  w->set_payload(std::string(reinterpret_cast<const char*>(init.data()),
                             4 * n));
  absl::StatusOr<v1::RegisterResponse> r = cluster->shard(0)->Register(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("--schedule: phase 0 tensors[0]: tensor \"zz\""));
  EXPECT_FALSE(cluster->shard(0)->Status().model_registered());

  // A shard with fp32 pulls cannot serve per-tensor pull codecs.
  auto pulls = CompressionSchedule::Parse(
      R"({"phases": [{"tensors": [{"tensor": "a",
                                   "pull": {"codec": "bf16"}}]}]})",
      "pulls.json");
  ASSERT_TRUE(pulls.ok());
  ShardConfig config;
  config.num_shards = 1;
  config.num_workers = 1;
  config.optimizer = ExactSgd();
  config.pull_codec = v1::CODEC_FP32;
  config.schedule = *pulls;
  prometheus::Registry registry;
  auto server = StartShard(config, 0, 0, &registry);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(),
              HasSubstr("--pull_codec is fp32; expected a compressed"));
}

}  // namespace
}  // namespace pserver
