// Large shards sum two pushes at once (one on a second core); the result
// must be bit-identical to summing one push at a time in worker order.
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/shard.h"
#include "tests/server/server_test_util.h"

namespace pserver {
namespace {

using testing_util::Gradient;
using testing_util::PushRequestFor;

constexpr uint64_t kBig = (uint64_t{1} << 17) + 1000;  // above the pair threshold

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

// Returns the state checksum; *paired counts the pairwise sums taken.
uint64_t RunRounds(v1::Codec codec, const std::vector<uint32_t>& order,
                   uint64_t* paired) {
  ShardConfig c;
  c.num_workers = 4;
  c.optimizer.kind = OptimizerKind::kAdam;
  auto shard = Shard::Create(c, nullptr);
  EXPECT_TRUE(shard.ok());
  for (uint32_t w = 0; w < 4; ++w) EXPECT_TRUE((*shard)->Register(BigRegister(w)).ok());
  v1::CodecParams params;
  params.set_k_fraction(0.01);
  auto enc = MakeCodec(codec, params);
  EXPECT_TRUE(enc.ok());
  for (uint64_t step = 0; step < 3; ++step) {
    for (uint32_t w : order) {
      v1::EncodedTensor t;
      EXPECT_TRUE((*enc)->Encode(Gradient(kBig, w, step), w + 10 * step, &t).ok());
      auto r = (*shard)->Push(PushRequestFor(w, step, t));
      EXPECT_TRUE(r.ok()) << r.status();
    }
  }
  EXPECT_EQ((*shard)->Status().current_step(), 3u);
  *paired = (*shard)->paired_sums();
  return (*shard)->Status().state_checksum();
}

TEST(Aggregation, PairedDecodeEqualsOneAtATimeInWorkerOrder) {
  for (v1::Codec codec : {v1::CODEC_FP32, v1::CODEC_ONEBIT, v1::CODEC_TOPK,
                          v1::CODEC_BF16}) {
    uint64_t pairs_seq = 0, pairs_rev = 0, pairs_mixed = 0;
    // In order: each push is summed as it arrives, one at a time.
    uint64_t sequential = RunRounds(codec, {0, 1, 2, 3}, &pairs_seq);
    // Reversed: all four are queued when worker 0 arrives, summed in pairs.
    uint64_t paired = RunRounds(codec, {3, 2, 1, 0}, &pairs_rev);
    uint64_t mixed = RunRounds(codec, {1, 0, 3, 2}, &pairs_mixed);
    EXPECT_EQ(pairs_seq, 0u);
    EXPECT_EQ(pairs_rev, 2u * 3);  // (0,1) and (2,3) in each of 3 rounds
    EXPECT_GT(pairs_mixed, 0u);
    EXPECT_EQ(paired, sequential) << CodecName(codec);
    EXPECT_EQ(mixed, sequential) << CodecName(codec);
  }
}

}  // namespace
}  // namespace pserver
