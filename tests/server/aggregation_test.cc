// Chunked rounds: each chunk is summed in worker-id order whatever order the
// chunks arrive in (several workers interleaved, chunks out of order), so the
// shard's state is bit-identical to pushes arriving in worker order; and for
// a codec whose encoding does not depend on where chunks start (fp32), the
// chunked round equals the one-chunk round.
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/shard.h"
#include "tests/server/server_test_util.h"

namespace pserver {
namespace {

using testing_util::Gradient;
using testing_util::PushRequestFor;

constexpr uint64_t kBig = (uint64_t{1} << 14) + 1000;

v1::RegisterRequest BigRegister(uint32_t w) {
  v1::RegisterRequest r;
  r.set_worker_id(w);
  r.set_num_workers(4);
  r.set_num_shards(1);
  v1::TensorSpec* t = r.mutable_layout()->add_tensors();
  t->set_name("big");
  t->add_shape(kBig);
  *r.mutable_initial_weights() =
      testing_util::Fp32Tensor(std::vector<float>(kBig, 0.25f));
  return r;
}

// One (worker, chunk) push of the arrival order.
struct Arrival {
  uint32_t worker;
  uint32_t chunk;
};

// Runs 3 rounds; in each the (worker, chunk) pushes arrive in `order` (which
// must name every pair once). Returns the state checksum.
uint64_t RunRounds(v1::Codec codec, uint64_t chunk_elements,
                   const std::vector<Arrival>& order) {
  ShardConfig c;
  c.num_workers = 4;
  c.optimizer.kind = OptimizerKind::kAdam;
  c.chunk_elements = chunk_elements;
  auto shard = Shard::Create(c, nullptr);
  EXPECT_TRUE(shard.ok());
  for (uint32_t w = 0; w < 4; ++w) {
    auto r = (*shard)->Register(BigRegister(w));
    EXPECT_TRUE(r.ok());
    EXPECT_EQ(r->chunk_elements(), chunk_elements);
  }
  const ChunkPlan plan{kBig, chunk_elements};
  v1::CodecParams params;
  params.set_k_fraction(0.01);
  auto enc = MakeCodec(codec, params);
  EXPECT_TRUE(enc.ok());
  for (uint64_t step = 0; step < 3; ++step) {
    EXPECT_EQ(order.size(), 4u * plan.num_chunks());
    for (const Arrival& a : order) {
      const std::vector<float> g = Gradient(kBig, a.worker, step);
      v1::EncodedTensor t;
      EXPECT_TRUE((*enc)
                      ->Encode(absl::MakeConstSpan(g).subspan(
                                   plan.begin(a.chunk), plan.size(a.chunk)),
                               a.worker + 10 * step + 100 * a.chunk, &t)
                      .ok());
      v1::PushRequest req = PushRequestFor(a.worker, step, t);
      req.set_chunk(a.chunk);
      auto r = (*shard)->Push(req);
      EXPECT_TRUE(r.ok()) << r.status();
    }
  }
  EXPECT_EQ((*shard)->Status().current_step(), 3u);
  return (*shard)->Status().state_checksum();
}

std::vector<Arrival> InOrder(uint32_t chunks) {
  std::vector<Arrival> out;
  for (uint32_t w = 0; w < 4; ++w) {
    for (uint32_t c = 0; c < chunks; ++c) out.push_back({w, c});
  }
  return out;
}

TEST(Aggregation, ChunksAreSummedInWorkerOrderWhateverTheArrivalOrder) {
  constexpr uint64_t kChunk = 4096;  // 5 chunks, the last one short
  const uint32_t chunks = ChunkPlan{kBig, kChunk}.num_chunks();
  ASSERT_EQ(chunks, 5u);
  // Workers backwards, each chunk backwards: every chunk waits in the queue
  // until worker 0's arrives.
  std::vector<Arrival> reversed;
  for (uint32_t w = 4; w-- > 0;) {
    for (uint32_t c = chunks; c-- > 0;) reversed.push_back({w, c});
  }
  // Interleaved as from four connections at once.
  std::vector<Arrival> interleaved;
  for (uint32_t c = 0; c < chunks; ++c) {
    for (uint32_t w : {2u, 0u, 3u, 1u}) interleaved.push_back({w, (c + w) % chunks});
  }
  for (v1::Codec codec : {v1::CODEC_FP32, v1::CODEC_ONEBIT, v1::CODEC_TOPK,
                          v1::CODEC_BF16}) {
    const uint64_t in_order = RunRounds(codec, kChunk, InOrder(chunks));
    EXPECT_EQ(RunRounds(codec, kChunk, reversed), in_order) << CodecName(codec);
    EXPECT_EQ(RunRounds(codec, kChunk, interleaved), in_order)
        << CodecName(codec);
  }
}

TEST(Aggregation, ChunkingDoesNotChangeAnFp32Round) {
  EXPECT_EQ(RunRounds(v1::CODEC_FP32, 4096, InOrder(5)),
            RunRounds(v1::CODEC_FP32, kDefaultChunkElements, InOrder(1)));
}

}  // namespace
}  // namespace pserver
