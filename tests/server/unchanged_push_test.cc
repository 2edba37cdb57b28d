// Pushes and pulls that leave out what the other side holds
// (CODEC_UNCHANGED, common/unchanged.h): a worker's buffer equal to its
// replica is summed as the replica's values, bit for bit what sending them
// gives; a pull delta of a buffer that did not change carries nothing; an
// unchanged piece over a parameter is refused and changes nothing.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/codec.h"
#include "gtest/gtest.h"
#include "server/shard.h"
#include "tests/server/server_test_util.h"

namespace pserver {
namespace {

using testing_util::Fp32Tensor;
using testing_util::Gradient;
using testing_util::InitialWeights;
using testing_util::PullRequestFor;
using testing_util::PushRequestFor;

constexpr uint64_t kN = testing_util::kSmallElements;
constexpr uint64_t kW = 768;  // "w" [0, 768), the buffer "b" [768, 1024)

v1::ModelLayout BufferLayout() {
  v1::ModelLayout layout = testing_util::SmallLayout();
  layout.mutable_tensors(1)->set_kind(v1::TENSOR_KIND_BUFFER);
  return layout;
}

std::unique_ptr<Shard> Registered(const ShardConfig& c,
                                  const std::vector<float>& x0) {
  return testing_util::Registered(c, BufferLayout(), x0);
}

// The parameter's gradient in fp32, then the buffer: its values, or
// unchanged.
v1::EncodedTensor Push(const std::vector<float>& g,
                       const std::vector<float>* buffer) {
  v1::EncodedTensor t;
  t.set_codec(v1::CODEC_SEGMENTS);
  t.set_num_elements(kN);
  *t.add_segments() = Fp32Tensor(absl::MakeConstSpan(g).subspan(0, kW));
  if (buffer != nullptr) {
    *t.add_segments() = Fp32Tensor(*buffer);
  } else {
    v1::EncodedTensor* u = t.add_segments();
    u->set_codec(v1::CODEC_UNCHANGED);
    u->set_num_elements(kN - kW);
  }
  return t;
}

// One shard and the replica a worker keeps of it by pulling deltas.
struct Side {
  std::unique_ptr<Shard> shard;
  std::vector<float> replica;

  std::vector<float> HeldBuffer() const {
    return std::vector<float>(replica.begin() + kW, replica.end());
  }
  // Pulls step t + 1 as a delta into the replica; returns the delta.
  v1::EncodedTensor Pull(uint64_t t) {
    absl::StatusOr<v1::PullResponse> r = shard->PullBlocking(
        PullRequestFor(0, t + 1, static_cast<int64_t>(t), ChecksumOf(replica)),
        absl::Seconds(10));
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    EXPECT_EQ(r->kind(), v1::PULL_KIND_DELTA);
    EXPECT_TRUE(DecoderFor(r->weights().codec())
                    ->DecodeAccumulate(r->weights(), 1.0f,
                                       absl::MakeSpan(replica))
                    .ok());
    EXPECT_EQ(ChecksumOf(replica), r->replica_checksum());
    return r->weights();
  }
};

// Adam with 1-bit pulls (the replica is x_hat, not x): worker 0's buffer
// never changes and goes as unchanged to one shard, as its values to the
// other; worker 1's changes for two rounds, then stays.
TEST(ShardUnchanged, AnUnchangedBufferSumsAsTheReplicasValuesAndPullsAsNothing) {
  ShardConfig c = testing_util::OneBitAdamConfig(2, /*freeze_step=*/100);
  const std::vector<float> x0 = InitialWeights(kN);
  Side marked{Registered(c, x0), x0}, sent{Registered(c, x0), x0};
  ASSERT_NE(marked.shard, nullptr);
  ASSERT_NE(sent.shard, nullptr);
  for (uint64_t t = 0; t < 4; ++t) {
    std::vector<float> held = marked.HeldBuffer();
    ASSERT_EQ(held, sent.HeldBuffer());
    std::vector<float> own = held;  // worker 1's buffer this round
    if (t < 2) {
      for (uint64_t i = 0; i < own.size(); ++i) own[i] += 0.5f * (t + 1);
    }
    for (uint32_t w = 0; w < 2; ++w) {
      const std::vector<float> g = Gradient(kN, w, t, 0.1f);
      const std::vector<float>* buffer = w == 0 ? &held : &own;
      absl::StatusOr<v1::PushResponse> a = marked.shard->Push(
          PushRequestFor(w, t, Push(g, w == 0 ? nullptr : buffer)));
      ASSERT_TRUE(a.ok()) << a.status();
      absl::StatusOr<v1::PushResponse> b =
          sent.shard->Push(PushRequestFor(w, t, Push(g, buffer)));
      ASSERT_TRUE(b.ok()) << b.status();
    }
    const v1::EncodedTensor d = marked.Pull(t);
    sent.Pull(t);
    ASSERT_EQ(marked.shard->Status().state_checksum(),
              sent.shard->Status().state_checksum())
        << "round " << t;
    ASSERT_EQ(marked.replica, sent.replica);
    ASSERT_EQ(d.codec(), v1::CODEC_SEGMENTS);
    ASSERT_EQ(d.segments_size(), 2);
    EXPECT_EQ(d.segments(0).codec(), v1::CODEC_ONEBIT);
    // The buffer moved in rounds 0 and 1 only (in round 2 it became the
    // mean of two equal values, which is them).
    EXPECT_EQ(d.segments(1).codec(),
              t < 2 ? v1::CODEC_FP32 : v1::CODEC_UNCHANGED)
        << "round " << t;
  }
}

TEST(ShardUnchanged, RefusedOverAParameterChangingNothing) {
  ShardConfig c = testing_util::ExactSgdConfig(2);
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard = Registered(c, x0);
  ASSERT_NE(shard, nullptr);
  const uint64_t before = shard->Status().state_checksum();
  v1::EncodedTensor t = Push(Gradient(kN, 0, 0), nullptr);
  // Unchanged over w [512, 768) as well as the buffer.
  t.mutable_segments(0)->CopyFrom(Fp32Tensor(
      absl::MakeConstSpan(Gradient(kN, 0, 0)).subspan(0, 512)));
  v1::EncodedTensor* u = t.mutable_segments(1);
  u->set_num_elements(kN - 512);
  absl::StatusOr<v1::PushResponse> r = shard->Push(PushRequestFor(0, 0, t));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "gradient (chunk 0): segments[1] is unchanged over element 512 "
            "of tensor 'w', a parameter; expected unchanged only over "
            "buffer tensors");
  EXPECT_EQ(shard->Status().state_checksum(), before);
  // Nothing of it is in the round: the worker's next push is its first.
  r = shard->Push(PushRequestFor(0, 0, Push(Gradient(kN, 0, 0), nullptr)));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->duplicate());
}

// Async: a push one step behind the shard cannot leave its buffer out (the
// replica it compared against is gone); refused, nothing summed.
TEST(ShardUnchanged, RefusedInAPushBehindTheShardUnderAsync) {
  ShardConfig c = testing_util::ExactSgdConfig(2);
  c.consistency.mode = Consistency::kAsync;
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard = Registered(c, x0);
  ASSERT_NE(shard, nullptr);
  const std::vector<float> held(x0.begin() + kW, x0.end());
  ASSERT_TRUE(
      shard->Push(PushRequestFor(0, 0, Push(Gradient(kN, 0, 0), &held))).ok());
  ASSERT_EQ(shard->Status().current_step(), 1u);
  const uint64_t before = shard->Status().state_checksum();
  absl::StatusOr<v1::PushResponse> r =
      shard->Push(PushRequestFor(1, 0, Push(Gradient(kN, 1, 0), nullptr)));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "gradient (chunk 0): unchanged pieces in a push of step 0; the "
            "shard is at step 1 (under ssp and async only a push of the "
            "shard's step may leave its buffers out)");
  EXPECT_EQ(shard->Status().state_checksum(), before);
  // The same push with its values is taken.
  r = shard->Push(PushRequestFor(1, 0, Push(Gradient(kN, 1, 0), &held)));
  EXPECT_TRUE(r.ok()) << r.status();
}

}  // namespace
}  // namespace pserver
