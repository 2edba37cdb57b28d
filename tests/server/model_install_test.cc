// Chunked installation of the initial weights (RegisterRequest.
// chunked_weights, server/model_install.h): the first worker becomes the
// installer and the model exists only once every chunk is in; other workers
// are told to retry (BUSY) meanwhile, and may take a silent installer's
// place after kInstallTimeout; a bad chunk is refused with the field named
// and changes nothing.
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "common/clock.h"
#include "common/rejection.h"
#include "gtest/gtest.h"
#include "server/shard.h"
#include "tests/server/server_test_util.h"

namespace pserver {
namespace {

using testing_util::Fp32Tensor;
using testing_util::PullRequestFor;

constexpr uint64_t kChunk = kMinChunkElements;
constexpr uint64_t kN = 2 * kChunk + 10;  // 3 chunks, the last of 10

v1::RegisterRequest Join(uint32_t w) {
  v1::RegisterRequest r;
  r.set_worker_id(w);
  r.set_num_workers(2);
  r.set_num_shards(1);
  v1::TensorSpec* t = r.mutable_layout()->add_tensors();
  t->set_name("w");
  t->add_shape(kN);
  r.set_chunked_weights(true);
  return r;
}

std::vector<float> Weights() {
  std::vector<float> x(kN);
  for (uint64_t i = 0; i < kN; ++i) x[i] = 0.5f + static_cast<float>(i);
  return x;
}

v1::RegisterRequest Chunk(uint32_t w, uint32_t c) {
  v1::RegisterRequest r = Join(w);
  const std::vector<float> x = Weights();
  const ChunkPlan plan{kN, kChunk};
  *r.mutable_initial_weights() =
      Fp32Tensor(absl::MakeConstSpan(x).subspan(plan.begin(c), plan.size(c)));
  r.set_weights_chunk(c);
  return r;
}

std::unique_ptr<Shard> MakeShard(FakeClock* clock) {
  ShardConfig c;
  c.num_workers = 2;
  c.optimizer.kind = OptimizerKind::kSgd;
  c.chunk_elements = kChunk;
  c.pull_codec = v1::CODEC_FP32;
  ShardEnv env;
  env.clock = clock;
  auto s = Shard::Create(c, env);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

TEST(ModelInstall, TheModelExistsOnceEveryChunkIsIn) {
  FakeClock clock;
  auto shard = MakeShard(&clock);
  auto first = shard->Register(Join(0));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->model_ready());
  EXPECT_EQ(first->chunk_elements(), kChunk);
  EXPECT_FALSE(shard->registered());
  // Worker 1 must wait for worker 0's installation.
  auto other = shard->Register(Join(1));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ReasonOf(other.status()), v1::REJECT_REASON_BUSY);
  EXPECT_TRUE(absl::StrContains(other.status().message(),
                                "worker 0 is installing the model (0 of 3"))
      << other.status();
  // Chunks in any order; a repeated one is harmless.
  for (uint32_t c : {2u, 0u, 2u}) {
    auto r = shard->Register(Chunk(0, c));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->model_ready());
  }
  auto last = shard->Register(Chunk(0, 1));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(last->model_ready());
  EXPECT_TRUE(last->initialized_model());
  EXPECT_TRUE(shard->registered());
  auto joined = shard->Register(Join(1));
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_TRUE(joined->model_ready());
  EXPECT_FALSE(joined->initialized_model());
  // The installed weights are the chunks' (a snapshot pull of step 0).
  absl::StatusOr<v1::PullResponse> pulled = shard->PullBlocking(
      PullRequestFor(1, 0, -1, 0, true), absl::Seconds(1));
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  std::vector<float> got(kChunk);
  ASSERT_EQ(pulled->weights().num_elements(), kChunk);  // chunk 0
  std::memcpy(got.data(), pulled->weights().payload().data(), kChunk * 4);
  const std::vector<float> want = Weights();
  EXPECT_EQ(got, std::vector<float>(want.begin(), want.begin() + kChunk));
}

TEST(ModelInstall, BadChunksAreRefusedAndChangeNothing) {
  FakeClock clock;
  auto shard = MakeShard(&clock);
  ASSERT_TRUE(shard->Register(Chunk(0, 0)).ok());
  v1::RegisterRequest bad_index = Chunk(0, 1);
  bad_index.set_weights_chunk(3);
  v1::RegisterRequest short_chunk = Chunk(0, 1);
  short_chunk.mutable_initial_weights()->set_num_elements(kChunk - 1);
  v1::RegisterRequest not_finite = Chunk(0, 2);
  float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(not_finite.mutable_initial_weights()->mutable_payload()->data(),
              &nan, 4);
  for (const auto& [req, field] :
       {std::pair{bad_index, "weights_chunk is 3; expected 0..2"},
        {short_chunk, "initial_weights holds 1023 elements"},
        {not_finite, "initial_weights (chunk 2)"}}) {
    auto r = shard->Register(req);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(r.status().message(), field)) << r.status();
  }
  // Still two chunks to go: 1 and 2.
  ASSERT_FALSE(shard->Register(Chunk(0, 1))->model_ready());
  EXPECT_TRUE(shard->Register(Chunk(0, 2))->model_ready());
}

TEST(ModelInstall, ASilentInstallerIsTakenOver) {
  FakeClock clock;
  auto shard = MakeShard(&clock);
  ASSERT_TRUE(shard->Register(Chunk(0, 0)).ok());
  clock.Advance(kInstallTimeout - absl::Seconds(1));
  EXPECT_EQ(ReasonOf(shard->Register(Join(1)).status()),
            v1::REJECT_REASON_BUSY);
  clock.Advance(absl::Seconds(2));
  auto r = shard->Register(Join(1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->model_ready());
  // Worker 1 starts over: its three chunks install the model.
  for (uint32_t c = 0; c < 3; ++c) ASSERT_TRUE(shard->Register(Chunk(1, c)).ok());
  EXPECT_TRUE(shard->registered());
  // The old installer's late chunk is just a Register of a joined worker.
  auto late = shard->Register(Chunk(0, 1));
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_TRUE(late->model_ready());
}

}  // namespace
}  // namespace pserver
