// PushEncoder's momentum-factor masking (worker/push_encoder.h): with the
// workers' momentum and a sparse push codec, every element a push carried
// restarts its momentum from zero, the push itself is unchanged, and the
// option is refused where it would do nothing or everything.
#include "worker/push_encoder.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/codec.h"
#include "common/layout.h"
#include "common/norms.h"
#include "common/tensor_codecs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kN = 1000;
constexpr float kBeta = 0.9f;

PushCodecs TopK(bool masking) {
  PushCodecs c;
  c.push = v1::CODEC_TOPK;
  c.push_params.set_k_fraction(0.01f);
  c.warmup = v1::CODEC_FP32;
  c.momentum_masking = masking;
  return c;
}

std::vector<float> RandomGradient(uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal;
  std::vector<float> g(kN);
  for (float& x : g) x = normal(rng);
  return g;
}

// An encoder in the compression stage (raw space, D = 1).
std::unique_ptr<PushEncoder> Compressing(const PushCodecs& codecs) {
  auto e = PushEncoder::Create(codecs, kN, /*freezes=*/true,
                               v1::GRADIENT_SPACE_RAW, kBeta);
  EXPECT_TRUE(e.ok()) << e.status();
  if (!e.ok()) return nullptr;
  auto d = Preconditioner::FromVariance(std::vector<float>(kN, 1.0f), 1e-8f);
  EXPECT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE((*e)->SetStage(v1::OPTIMIZER_STAGE_COMPRESSION, *std::move(d))
                  .ok());
  return *std::move(e);
}

std::vector<float> Decoded(const v1::EncodedTensor& t) {
  std::vector<float> x(t.num_elements());
  EXPECT_TRUE(DecoderFor(t.codec())->Decode(t, absl::MakeSpan(x)).ok());
  return x;
}

TEST(PushEncoderMasking, SentElementsRestartTheirMomentumTheRestKeepIt) {
  auto plain = Compressing(TopK(false));
  auto masked = Compressing(TopK(true));
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(masked, nullptr);
  std::vector<float> u(kN, 0.0f);  // the momentum masking should leave
  for (uint64_t step = 0; step < 3; ++step) {
    const std::vector<float> g = RandomGradient(step);
    v1::PushRequest a, b;
    ASSERT_TRUE(plain->EncodeChunk(g, 0, step, &a).ok());
    ASSERT_TRUE(masked->EncodeChunk(g, 0, step, &b).ok());
    EXPECT_TRUE(b.momentum());
    const std::vector<float> sent = Decoded(b.gradient());
    uint64_t carried = 0;
    for (uint64_t i = 0; i < kN; ++i) {
      u[i] = kBeta * u[i] + (1.0f - kBeta) * g[i];
      if (sent[i] != 0.0f) {
        u[i] = 0.0f;
        ++carried;
      }
      ASSERT_EQ(masked->momentum()[i], u[i]) << "step " << step << " [" << i
                                             << "]";
    }
    EXPECT_EQ(carried, 10u);
    if (step == 0) {
      // Nothing was masked before the first push: the same push.
      EXPECT_EQ(a.gradient().SerializeAsString(),
                b.gradient().SerializeAsString());
      for (uint64_t i = 0; i < kN; ++i) {
        ASSERT_EQ(plain->momentum()[i], (1.0f - kBeta) * g[i]);
      }
    }
  }
  // Without masking the momentum of the sent elements lives on.
  uint64_t differ = 0;
  for (uint64_t i = 0; i < kN; ++i) {
    differ += plain->momentum()[i] != masked->momentum()[i];
  }
  EXPECT_GE(differ, 10u);
}

TEST(PushEncoderMasking, UnderPerTensorCodecsOnlyTheSparseSegmentsMask) {
  // Tensor "a" (600 elements) takes the stream's TopK, "b" (400) fp32 of its
  // own: the push is two segments, and only a's sent elements restart.
  auto e = Compressing(TopK(true));
  ASSERT_NE(e, nullptr);
  auto fp32 = MakeCodec(v1::CODEC_FP32, v1::CodecParams());
  ASSERT_TRUE(fp32.ok());
  const std::vector<TensorSlot> slots = {{"a", 0, 600, 0}, {"b", 600, 400, 0}};
  e->UseTensorCodecs(
      CodecPlan::ForSlice(slots, {0, kN}, {nullptr, fp32->get()}));
  const std::vector<float> g = RandomGradient(7);
  v1::PushRequest req;
  ASSERT_TRUE(e->EncodeChunk(g, 0, 7, &req).ok());
  ASSERT_EQ(req.gradient().codec(), v1::CODEC_SEGMENTS);
  ASSERT_EQ(req.gradient().segments_size(), 2);
  const std::vector<float> sent = Decoded(req.gradient().segments(0));
  uint64_t carried = 0;
  for (uint64_t i = 0; i < kN; ++i) {
    const float u = (1.0f - kBeta) * g[i];
    if (i < 600 && sent[i] != 0.0f) {
      ++carried;
      ASSERT_EQ(e->momentum()[i], 0.0f) << i;
    } else {
      ASSERT_EQ(e->momentum()[i], u) << i;
    }
  }
  EXPECT_EQ(carried, 6u);  // 1% of a's 600
}

TEST(PushEncoderMasking, RefusedWithADenseCodecOrWithoutTheWorkersMomentum) {
  PushCodecs onebit = TopK(true);
  onebit.push = v1::CODEC_ONEBIT;
  onebit.push_params.clear_k_fraction();
  auto e = PushEncoder::Create(onebit, kN, true, v1::GRADIENT_SPACE_RAW, kBeta);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(e.status().message()),
              HasSubstr("needs a sparse push codec"));
  EXPECT_THAT(std::string(e.status().message()), HasSubstr("onebit"));
  for (auto [freezes, beta] : {std::pair{true, 0.0f}, std::pair{false, kBeta}}) {
    auto f = PushEncoder::Create(TopK(true), kN, freezes,
                                 v1::GRADIENT_SPACE_RAW, beta);
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(f.status().message()),
                HasSubstr("--onebit_momentum=worker"));
  }
  EXPECT_TRUE(PushEncoder::Create(TopK(true), kN, true,
                                  v1::GRADIENT_SPACE_RAW, kBeta)
                  .ok());
}

}  // namespace
}  // namespace pserver

namespace pserver {
namespace {

// Issue 27: buffers (TENSOR_KIND_BUFFER) are pushed as they are, in every
// stage: exactly (fp32, WithExactBuffers), neither preconditioned nor
// turned into the worker's momentum, while the parameters around them are.
TEST(PushEncoderBuffers, BuffersArePushedRawAndExactInTheCompressionStage) {
  PushCodecs codecs;
  codecs.push = v1::CODEC_ONEBIT;
  codecs.warmup = v1::CODEC_BF16;
  auto e = PushEncoder::Create(codecs, kN, /*freezes=*/true,
                               v1::GRADIENT_SPACE_PRECONDITIONED, kBeta);
  ASSERT_TRUE(e.ok()) << e.status();
  TensorSlot a{"a", 0, 700, 0}, bn{"bn", 700, 300, 0};
  bn.buffer = true;
  const std::vector<TensorSlot> slots = {a, bn};
  (*e)->UseTensorCodecs(CodecPlan::ForSlice(
      slots, {0, kN},
      WithExactBuffers(slots, std::vector<const Codec*>(2, nullptr))));
  (*e)->SetRawRanges({{700, kN}});
  const std::vector<float> g = RandomGradient(3);
  // Warmup: bf16 for the parameters, the buffer exact.
  v1::PushRequest warm;
  ASSERT_TRUE((*e)->EncodeChunk(g, 0, 1, &warm).ok());
  ASSERT_EQ(warm.gradient().codec(), v1::CODEC_SEGMENTS);
  EXPECT_EQ(warm.gradient().segments(0).codec(), v1::CODEC_BF16);
  EXPECT_EQ(warm.gradient().segments(1).codec(), v1::CODEC_FP32);
  std::vector<float> buf = Decoded(warm.gradient().segments(1));
  for (uint64_t i = 0; i < 300; ++i) ASSERT_EQ(buf[i], g[700 + i]) << i;
  // Compression: D = 4 everywhere (v = 1/16), momentum with kBeta.
  auto d = Preconditioner::FromVariance(std::vector<float>(kN, 0.0625f), 0.0f);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(
      (*e)->SetStage(v1::OPTIMIZER_STAGE_COMPRESSION, *std::move(d)).ok());
  for (uint64_t round = 0; round < 2; ++round) {
    v1::PushRequest req;
    ASSERT_TRUE((*e)->EncodeChunk(g, 0, 2 + round, &req).ok());
    EXPECT_TRUE(req.momentum());
    EXPECT_EQ(req.space(), v1::GRADIENT_SPACE_PRECONDITIONED);
    ASSERT_EQ(req.gradient().segments_size(), 2);
    EXPECT_EQ(req.gradient().segments(0).codec(), v1::CODEC_ONEBIT);
    buf = Decoded(req.gradient().segments(1));
    for (uint64_t i = 0; i < 300; ++i) {
      ASSERT_EQ(buf[i], g[700 + i]) << "round " << round << " element " << i;
    }
    // The parameters' momentum is (1 - beta) D g after the first round.
    if (round == 0) {
      EXPECT_FLOAT_EQ((*e)->momentum()[5], (1.0f - kBeta) * 4.0f * g[5]);
    }
  }
}

// The bound of what is encoded, taken where it is written (D ⊙ g, the
// workers' momentum) or handed in by the caller (its finite check's), gives
// the payloads of an encoder that finds it by a pass of its own, bit for
// bit, step after step: in the warmup (raw), with D, and with D and the
// workers' momentum.
TEST(PushEncoderBound, TheCallersAndTheEncodersBoundsGiveTheSamePayloads) {
  PushCodecs codecs;
  codecs.push = v1::CODEC_ONEBIT;
  codecs.warmup = v1::CODEC_ONEBIT;
  std::vector<float> v = RandomGradient(99);
  for (float& x : v) x = x * x + 0.01f;  // a non-uniform D
  for (float beta : {0.0f, kBeta}) {
    for (bool compressing : {false, true}) {
      std::unique_ptr<PushEncoder> enc[2];
      for (auto& e : enc) {
        auto made = PushEncoder::Create(codecs, kN, /*freezes=*/true,
                                        v1::GRADIENT_SPACE_PRECONDITIONED,
                                        beta);
        ASSERT_TRUE(made.ok()) << made.status();
        e = *std::move(made);
        if (compressing) {
          auto d = Preconditioner::FromVariance(v, 1e-8f);
          ASSERT_TRUE(d.ok()) << d.status();
          ASSERT_TRUE(
              e->SetStage(v1::OPTIMIZER_STAGE_COMPRESSION, *std::move(d)).ok());
        }
      }
      for (int step = 0; step < 4; ++step) {
        const std::vector<float> g = RandomGradient(step + 1);
        for (uint64_t b : {uint64_t{0}, uint64_t{600}}) {
          const absl::Span<const float> piece =
              absl::MakeConstSpan(g).subspan(b, b == 0 ? 600 : kN - 600);
          v1::PushRequest want, got;
          ASSERT_TRUE(enc[0]->EncodeChunk(piece, b, step, &want).ok());
          ASSERT_TRUE(
              enc[1]->EncodeChunk(piece, b, step, &got, MaxAbs(piece)).ok());
          EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString())
              << "beta " << beta << " compressing " << compressing << " step "
              << step << " chunk " << b;
        }
      }
    }
  }
}

// The workers' momentum kernel writes beta u + (1 - beta) g element by
// element (the vector loop's arithmetic is the scalar one's) and returns
// the bits whose MaxAbsOfBits is exactly MaxAbs of what it wrote, at every
// length (the vector loop's tail included), +inf once a value is not
// finite.
TEST(PushEncoderBound, TheMomentumLoopTakesTheMaxAbsOfItsOutput) {
  const std::vector<float> u = RandomGradient(7), g = RandomGradient(8);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{33},
                   size_t{kN}}) {
    std::vector<float> out(n, -1.0f);
    const uint32_t top = MixTaking(kBeta, u.data(), g.data(), out.data(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], kBeta * u[i] + (1.0f - kBeta) * g[i])
          << "n " << n << " element " << i;
    }
    EXPECT_EQ(MaxAbsOfBits(top), MaxAbs(out)) << "n " << n;
  }
  // The largest magnitude from a negative value, in the scalar tail (33
  // is no multiple of the vector width) and in the vector body.
  std::vector<float> big = g, out(kN);
  big[32] = -1000.0f;
  uint32_t top = MixTaking(kBeta, u.data(), big.data(), out.data(), 33);
  EXPECT_EQ(MaxAbsOfBits(top), std::fabs(out[32]));
  EXPECT_GT(std::fabs(out[32]), 90.0f);
  big[32] = g[32];
  big[17] = -1000.0f;
  top = MixTaking(kBeta, u.data(), big.data(), out.data(), 33);
  EXPECT_EQ(MaxAbsOfBits(top), std::fabs(out[17]));
  EXPECT_GT(std::fabs(out[17]), 90.0f);
  big[3] = NAN;
  EXPECT_EQ(MaxAbsOfBits(MixTaking(kBeta, u.data(), big.data(), out.data(), kN)),
            INFINITY);
}

// Apply's max_abs is MaxAbs of what it wrote, +inf for a non-finite value.
TEST(Preconditioner, ApplyTakesTheMaxAbsOfItsOutput) {
  std::vector<float> v = RandomGradient(5);
  for (float& x : v) x = x * x + 0.01f;
  auto d = Preconditioner::FromVariance(v, 1e-8f);
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<float> g = RandomGradient(6);
  double max_abs = -1;
  absl::Span<const float> out = d->Apply(absl::MakeConstSpan(g).subspan(3, 500),
                                         3, &max_abs);
  EXPECT_EQ(max_abs, MaxAbs(out));
  EXPECT_GT(max_abs, 0.0);
  g[100] = -INFINITY;
  d->Apply(g, 0, &max_abs);
  EXPECT_EQ(max_abs, INFINITY);
}

}  // namespace
}  // namespace pserver

namespace pserver {
namespace {

// A tensor without a gradient (torch's `.grad` None; SetWithoutGradient):
// its range goes as CODEC_NO_GRADIENT, whatever the gradient holds there,
// and its residual and momentum stay as they were; the next step with a
// gradient for it pushes as before.
TEST(PushEncoderNoGradient, AnAbsentRangeGoesAsNothingKeepingItsState) {
  PushCodecs codecs;
  codecs.push = v1::CODEC_ONEBIT;
  codecs.warmup = v1::CODEC_FP32;
  auto e = Compressing(codecs);
  ASSERT_NE(e, nullptr);
  v1::PushRequest req;
  ASSERT_TRUE(e->EncodeChunk(RandomGradient(1), 0, 1, &req).ok());
  const std::vector<float> u(e->momentum().begin(), e->momentum().end());
  const absl::Span<const float> r0 = e->push_ef().residual();
  const std::vector<float> residual(r0.begin(), r0.end());
  ASSERT_EQ(residual.size(), kN);

  e->SetWithoutGradient({{200, 500}});
  std::vector<float> g = RandomGradient(2);
  for (uint64_t i = 200; i < 500; ++i) g[i] = 1e3f;  // never read
  ASSERT_TRUE(e->EncodeChunk(g, 0, 2, &req).ok());
  ASSERT_EQ(req.gradient().codec(), v1::CODEC_SEGMENTS);
  ASSERT_EQ(req.gradient().segments_size(), 3);
  EXPECT_EQ(req.gradient().segments(0).codec(), v1::CODEC_ONEBIT);
  EXPECT_EQ(req.gradient().segments(1).codec(), v1::CODEC_NO_GRADIENT);
  EXPECT_EQ(req.gradient().segments(1).num_elements(), 300u);
  EXPECT_TRUE(req.gradient().segments(1).payload().empty());
  EXPECT_EQ(req.gradient().segments(2).codec(), v1::CODEC_ONEBIT);
  const std::vector<float> sent = Decoded(req.gradient());
  for (uint64_t i = 0; i < kN; ++i) {
    const bool absent = i >= 200 && i < 500;
    if (absent) {
      ASSERT_EQ(sent[i], 0.0f) << i;
      ASSERT_EQ(e->momentum()[i], u[i]) << i;
      ASSERT_EQ(e->push_ef().residual()[i], residual[i]) << i;
    } else {
      ASSERT_EQ(e->momentum()[i], kBeta * u[i] + (1.0f - kBeta) * g[i]) << i;
    }
  }

  e->SetWithoutGradient({});
  ASSERT_TRUE(e->EncodeChunk(RandomGradient(3), 0, 3, &req).ok());
  EXPECT_EQ(req.gradient().codec(), v1::CODEC_ONEBIT);
}

// CodecPlan::WithoutGradient over a plan with per-tensor codecs: the
// absent ranges cut the pieces, neighbours keep their codecs.
TEST(PushEncoderNoGradient, ThePlanCutsAbsentRangesOutOfItsPieces) {
  std::vector<TensorSlot> slots(3);
  slots[0] = {"a", 0, 100};
  slots[1] = {"b", 100, 100};
  slots[2] = {"c", 200, 100};
  const std::vector<const Codec*> codecs = {
      nullptr, DecoderFor(v1::CODEC_FP32), nullptr};
  const CodecPlan plan =
      CodecPlan::ForSlice(slots, ShardRange{0, 300}, codecs)
          .WithoutGradient({{150, 250}});
  std::vector<CodecPiece> cut;
  plan.Cut(0, 300, &cut);
  ASSERT_EQ(cut.size(), 4u);
  EXPECT_EQ(cut[0].end, 100u);
  EXPECT_EQ(cut[0].codec, nullptr);
  EXPECT_EQ(cut[1].end, 150u);
  EXPECT_EQ(cut[1].codec, DecoderFor(v1::CODEC_FP32));
  EXPECT_EQ(cut[2].end, 250u);
  EXPECT_EQ(cut[2].codec, NoGradientMarker());
  EXPECT_EQ(cut[3].end, 300u);
  EXPECT_EQ(cut[3].codec, nullptr);
  // A uniform plan takes the stream's codec around the absent range.
  CodecPlan::ForSlice(slots, ShardRange{0, 300}, {nullptr, nullptr, nullptr})
      .WithoutGradient({{100, 200}})
      .Cut(50, 200, &cut);
  ASSERT_EQ(cut.size(), 3u);
  EXPECT_EQ(cut[0].begin, 50u);
  EXPECT_EQ(cut[1].codec, NoGradientMarker());
  EXPECT_EQ(cut[2].end, 250u);
  EXPECT_EQ(cut[2].codec, nullptr);
}

}  // namespace
}  // namespace pserver
