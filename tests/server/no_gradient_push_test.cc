// Pushes that say a worker had no gradient for a tensor (CODEC_NO_GRADIENT,
// torch's `.grad` None): a tensor no push of the round had a gradient for
// is not stepped (no momentum, no weight decay, its own step count for
// Adam's bias correction, as torch.optim.AdamW), under bsp and async; one
// that only some workers lacked takes the mean with zeros for them (as
// DDP); a no-gradient piece over a buffer is refused and changes nothing.
#include <cstdint>
#include <memory>
#include <vector>

#include "common/checksum.h"
#include "common/codec.h"
#include "gtest/gtest.h"
#include "server/checkpoint.h"
#include "server/shard.h"
#include "tests/server/ref_adam.h"
#include "tests/server/server_test_util.h"

namespace pserver {
namespace {

using testing_util::Fp32Tensor;
using testing_util::Gradient;
using testing_util::InitialWeights;
using testing_util::PullRequestFor;
using testing_util::PushRequestFor;
using testing_util::RefAdam;

constexpr uint64_t kN = testing_util::kSmallElements;
constexpr uint64_t kW = 768;  // "w" [0, 768), "b" [768, 1024)

// w's gradient in fp32, then b's: its values, or no gradient.
v1::EncodedTensor Push(const std::vector<float>& g, bool b_absent) {
  v1::EncodedTensor t;
  t.set_codec(v1::CODEC_SEGMENTS);
  t.set_num_elements(kN);
  *t.add_segments() = Fp32Tensor(absl::MakeConstSpan(g).subspan(0, kW));
  if (!b_absent) {
    *t.add_segments() = Fp32Tensor(absl::MakeConstSpan(g).subspan(kW));
  } else {
    v1::EncodedTensor* u = t.add_segments();
    u->set_codec(v1::CODEC_NO_GRADIENT);
    u->set_num_elements(kN - kW);
  }
  return t;
}

// torch.optim.AdamW's settings: bias correction, decoupled weight decay.
ShardConfig AdamWConfig(uint32_t workers) {
  ShardConfig c;
  c.num_workers = workers;
  c.optimizer.kind = OptimizerKind::kAdam;
  c.optimizer.lr = 1e-2f;
  c.optimizer.weight_decay = 0.1f;
  c.optimizer.bias_correction = true;
  c.pull_codec = v1::CODEC_FP32;
  return c;
}

std::vector<float> Weights(Shard& shard, uint64_t step) {
  absl::StatusOr<v1::PullResponse> r = shard.PullBlocking(
      PullRequestFor(0, step, -1, 0, /*want_snapshot=*/true),
      absl::Seconds(10));
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  return testing_util::DecodeAll(r->weights());
}

// Each tensor against its own AdamW, b stepped only in the rounds with a
// gradient for it (its t counts those rounds only).
void ExpectAdamW(const std::vector<float>& got, const RefAdam& w,
                 const RefAdam& b, uint64_t round) {
  ASSERT_EQ(got.size(), kN);
  for (uint64_t i = 0; i < kN; ++i) {
    const double want = i < kW ? w.x[i] : b.x[i - kW];
    ASSERT_NEAR(got[i], want, 1e-6 + 1e-5 * std::abs(want))
        << "element " << i << " after round " << round;
  }
}

void CheckSkippedTensor(Consistency mode) {
  const uint32_t workers = mode == Consistency::kAsync ? 1 : 2;
  ShardConfig c = AdamWConfig(workers);
  c.consistency.mode = mode;
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard =
      testing_util::Registered(c, testing_util::SmallLayout(), x0);
  ASSERT_NE(shard, nullptr);
  auto ref = [&](uint64_t from, uint64_t to) {
    RefAdam r = RefAdam::At(absl::MakeConstSpan(x0).subspan(from, to - from));
    r.lr = 1e-2;
    r.wd = 0.1;
    r.bias = true;
    return r;
  };
  RefAdam w = ref(0, kW), b = ref(kW, kN);
  for (uint64_t t = 0; t < 6; ++t) {
    // b has a gradient in rounds 0, 3 and 4 only.
    const bool absent = t == 1 || t == 2 || t == 5;
    std::vector<float> mean(kN, 0.0f);
    for (uint32_t k = 0; k < workers; ++k) {
      const std::vector<float> g = Gradient(kN, k, t, 0.1f);
      for (uint64_t i = 0; i < kN; ++i) mean[i] += g[i] / workers;
      absl::StatusOr<v1::PushResponse> r =
          shard->Push(PushRequestFor(k, t, Push(g, absent)));
      ASSERT_TRUE(r.ok()) << r.status();
    }
    w.Step(mean);
    if (!absent) b.Step(absl::MakeConstSpan(mean).subspan(kW));
    const std::vector<float> x = Weights(*shard, t + 1);
    if (absent && t > 0) {
      // Not moved by momentum or weight decay.
      const std::vector<float> before = Weights(*shard, t);
      for (uint64_t i = kW; i < kN; ++i) ASSERT_EQ(x[i], before[i]);
    }
    ExpectAdamW(x, w, b, t);
  }
}

TEST(ShardNoGradient, ATensorNoWorkerHadAGradientForIsNotSteppedBsp) {
  CheckSkippedTensor(Consistency::kBsp);
}

TEST(ShardNoGradient, ATensorWithoutAGradientIsNotSteppedAsync) {
  CheckSkippedTensor(Consistency::kAsync);
}

// One worker without b's gradient: the same round as if it had pushed
// zeros for it (DDP's mean), bit for bit.
TEST(ShardNoGradient, OneWorkerWithoutAGradientCountsAsZeros) {
  const ShardConfig c = AdamWConfig(2);
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> marked =
      testing_util::Registered(c, testing_util::SmallLayout(), x0);
  std::unique_ptr<Shard> zeros =
      testing_util::Registered(c, testing_util::SmallLayout(), x0);
  ASSERT_NE(marked, nullptr);
  ASSERT_NE(zeros, nullptr);
  for (uint64_t t = 0; t < 3; ++t) {
    for (uint32_t k = 0; k < 2; ++k) {
      std::vector<float> g = Gradient(kN, k, t, 0.1f);
      ASSERT_TRUE(marked->Push(PushRequestFor(k, t, Push(g, k == 1))).ok());
      if (k == 1) std::fill(g.begin() + kW, g.end(), 0.0f);
      ASSERT_TRUE(zeros->Push(PushRequestFor(k, t, Push(g, false))).ok());
    }
    ASSERT_EQ(Weights(*marked, t + 1), Weights(*zeros, t + 1));
    ASSERT_EQ(marked->Status().state_checksum(),
              zeros->Status().state_checksum());
  }
}

TEST(ShardNoGradient, RefusedOverABufferChangingNothing) {
  v1::ModelLayout layout = testing_util::SmallLayout();
  layout.mutable_tensors(1)->set_kind(v1::TENSOR_KIND_BUFFER);
  const ShardConfig c = AdamWConfig(1);
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard = testing_util::Registered(c, layout, x0);
  ASSERT_NE(shard, nullptr);
  const uint64_t before = shard->Status().state_checksum();
  const std::vector<float> g = Gradient(kN, 0, 0, 0.1f);
  absl::StatusOr<v1::PushResponse> r =
      shard->Push(PushRequestFor(0, 0, Push(g, true)));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "gradient (chunk 0): segments[1] is no_gradient over element 768 "
            "of tensor 'b', a buffer; expected no_gradient only over "
            "parameter tensors");
  EXPECT_EQ(shard->Status().state_checksum(), before);
  r = shard->Push(PushRequestFor(0, 0, Push(g, false)));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->duplicate());
}

// The rounds a tensor sat out travel with the shard's state: a shard
// restored from it steps b with b's own count, as the original does.
TEST(ShardNoGradient, IdleRoundsSurviveACheckpoint) {
  const ShardConfig c = AdamWConfig(1);
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> a =
      testing_util::Registered(c, testing_util::SmallLayout(), x0);
  ASSERT_NE(a, nullptr);
  for (uint64_t t = 0; t < 3; ++t) {
    ASSERT_TRUE(
        a->Push(PushRequestFor(0, t, Push(Gradient(kN, 0, t, 0.1f), t > 0)))
            .ok());
  }
  v1::GetShardStateRequest get;
  absl::StatusOr<v1::GetShardStateResponse> got = a->GetShardState(get);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->num_chunks(), 1u);
  absl::StatusOr<ShardState> saved = ParseShardState(got->data());
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->idle_rounds, (std::vector<int64_t>{0, 2}));
  absl::StatusOr<std::unique_ptr<Shard>> b = Shard::Create(c, nullptr);
  ASSERT_TRUE(b.ok()) << b.status();
  v1::InstallShardStateRequest install;
  install.set_total_bytes(got->data().size());
  install.set_step(got->step());
  install.set_replica_checksum(got->replica_checksum());
  install.set_data(got->data());
  absl::StatusOr<v1::InstallShardStateResponse> in =
      (*b)->InstallShardState(install);
  ASSERT_TRUE(in.ok()) << in.status();
  ASSERT_TRUE(in->installed());
  ASSERT_TRUE((*b)->Register(testing_util::RegisterRequestFor(0, 1, x0)).ok());
  for (Shard* s : {a.get(), b->get()}) {
    ASSERT_TRUE(
        s->Push(PushRequestFor(0, 3, Push(Gradient(kN, 0, 3, 0.1f), false)))
            .ok());
  }
  EXPECT_EQ(Weights(*a, 4), Weights(**b, 4));

  // A count that is not one per tensor of the shard is refused.
  ShardState wrong = *saved;
  wrong.idle_rounds = {0, 1, 2};
  absl::StatusOr<ShardState> refused =
      ParseShardState(SerializeShardState(wrong));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "checkpoint idle_rounds has 3 entries; expected 0 or 2 (the "
            "shard's tensors)");
  wrong.idle_rounds = {0, 4};
  refused = ParseShardState(SerializeShardState(wrong));
  EXPECT_EQ(refused.status().message(),
            "checkpoint idle_rounds[1] is 4; expected 0..3 (the step)");
}

// A push with PushRequest.overflow (a worker's loss scaler found inf/NaN)
// skips the round for every worker: x as it was, Adam's step count not
// advanced (the next round equals AdamW's with that round left out), and
// the next step's pulls say so (PullResponse.round_skipped), once.
TEST(ShardNoGradient, AnOverflowSkipsTheRoundForEveryWorker) {
  const ShardConfig c = AdamWConfig(2);
  const std::vector<float> x0 = InitialWeights(kN);
  std::unique_ptr<Shard> shard =
      testing_util::Registered(c, testing_util::SmallLayout(), x0);
  ASSERT_NE(shard, nullptr);
  RefAdam w = RefAdam::At(absl::MakeConstSpan(x0).subspan(0, kW));
  RefAdam b = RefAdam::At(absl::MakeConstSpan(x0).subspan(kW));
  for (RefAdam* r : {&w, &b}) {
    r->lr = 1e-2;
    r->wd = 0.1;
    r->bias = true;
  }
  std::vector<float> before = x0;
  for (uint64_t t = 0; t < 4; ++t) {
    const bool overflow = t == 1;
    std::vector<float> mean(kN, 0.0f);
    for (uint32_t k = 0; k < 2; ++k) {
      const std::vector<float> g = Gradient(kN, k, t, 0.1f);
      for (uint64_t i = 0; i < kN; ++i) mean[i] += g[i] / 2;
      // Worker 1 overflowed: both of its pieces go as no gradient.
      v1::PushRequest req = PushRequestFor(k, t, Push(g, false));
      if (overflow && k == 1) {
        req = PushRequestFor(k, t, Push(g, true));
        v1::EncodedTensor* piece = req.mutable_gradient()->mutable_segments(0);
        piece->Clear();
        piece->set_codec(v1::CODEC_NO_GRADIENT);
        piece->set_num_elements(kW);
        req.set_overflow(true);
      }
      absl::StatusOr<v1::PushResponse> r = shard->Push(req);
      ASSERT_TRUE(r.ok()) << r.status();
    }
    if (!overflow) {
      w.Step(mean);
      b.Step(absl::MakeConstSpan(mean).subspan(kW));
    }
    absl::StatusOr<v1::PullResponse> pulled = shard->PullBlocking(
        PullRequestFor(0, t + 1, -1, 0, /*want_snapshot=*/true),
        absl::Seconds(10));
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    EXPECT_EQ(pulled->round_skipped(), overflow) << "round " << t;
    const std::vector<float> x = testing_util::DecodeAll(pulled->weights());
    if (overflow) {
      EXPECT_EQ(x, before) << "the skipped round moved x";
    } else {
      EXPECT_NE(x, before) << "round " << t << " did not move x";
    }
    ExpectAdamW(x, w, b, t);
    before = x;
  }
}

}  // namespace
}  // namespace pserver
