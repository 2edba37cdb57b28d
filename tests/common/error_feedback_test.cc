#include "common/error_feedback.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/norms.h"
#include "gtest/gtest.h"
#include "tests/common/codec_test_util.h"

namespace pserver {
namespace {

using testing_util::AllCodecCases;
using testing_util::CaseName;
using testing_util::CodecCase;
using testing_util::MustMake;
using testing_util::RandomVector;

class ErrorFeedbackAllCodecs : public ::testing::TestWithParam<CodecCase> {};

// The residual as n values (an empty residual is all zeros).
std::vector<float> Residual(const ErrorFeedback& ef) {
  absl::Span<const float> r = ef.residual();
  if (r.empty()) return std::vector<float>(ef.size(), 0.0f);
  return std::vector<float>(r.begin(), r.end());
}

// sum_t decode(c_t) + e_T == sum_t g_t (decay 1): nothing is ever lost.
TEST_P(ErrorFeedbackAllCodecs, TelescopingIdentityOver1000Steps) {
  constexpr size_t kN = 1000;
  constexpr int kSteps = 1000;
  auto codec = MustMake(GetParam().codec, GetParam().params);
  ErrorFeedback ef(codec.get(), kN);
  std::vector<double> sum_in(kN, 0.0), sum_out(kN, 0.0);
  std::vector<float> d(kN);
  v1::EncodedTensor t;
  double max_abs_in = 0;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float> g = RandomVector(kN, 1000 + step);
    ASSERT_TRUE(ef.Encode(g, step, &t).ok());
    ASSERT_TRUE(codec->Decode(t, absl::MakeSpan(d)).ok());
    for (size_t i = 0; i < kN; ++i) {
      sum_in[i] += g[i];
      sum_out[i] += d[i];
      max_abs_in = std::max(max_abs_in, std::fabs(sum_in[i]));
    }
  }
  double worst = 0;
  const std::vector<float> e = Residual(ef);
  for (size_t i = 0; i < kN; ++i) {
    worst = std::max(worst, std::fabs(sum_out[i] + e[i] - sum_in[i]));
  }
  // Each step adds one fp32 rounding of u - decode(u) (|u| ~ a few units).
  EXPECT_LT(worst, 1e-3) << "max |sum of inputs| " << max_abs_in;
  EXPECT_TRUE(std::isfinite(ef.ResidualNorm()));
}

TEST_P(ErrorFeedbackAllCodecs, RejectedInputLeavesResidualUnchanged) {
  auto codec = MustMake(GetParam().codec, GetParam().params);
  ErrorFeedback ef(codec.get(), 300, 0.5f);
  v1::EncodedTensor t;
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(ef.Encode(RandomVector(300, step), step, &t).ok());
  }
  const std::vector<float> before = Residual(ef);
  std::vector<float> g = RandomVector(300, 9);
  g[3] = NAN;
  absl::Status s = ef.Encode(g, 4, &t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(0, std::memcmp(before.data(), Residual(ef).data(), 300 * 4));
  s = ef.Encode(RandomVector(299, 1), 4, &t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(0, std::memcmp(before.data(), Residual(ef).data(), 300 * 4));
  // A piece outside the residual is refused the same way.
  s = ef.EncodeAt(200, RandomVector(101, 1), 4, &t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(0, std::memcmp(before.data(), Residual(ef).data(), 300 * 4));
}

// Encoding a stream in pieces (chunks of a push) that start on block
// boundaries gives the bytes and the residual of encoding it whole, piece by
// piece: each piece reads and writes only its own part of the residual.
TEST_P(ErrorFeedbackAllCodecs, PiecesReadAndWriteOnlyTheirOwnResidual) {
  auto codec = MustMake(GetParam().codec, GetParam().params);
  constexpr size_t kN = 1024, kPiece = 256;
  ErrorFeedback whole(codec.get(), kN, 0.5f);
  ErrorFeedback pieces(codec.get(), kN, 0.5f);
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> g = RandomVector(kN, 50 + step);
    for (size_t b = 0; b < kN; b += kPiece) {
      const absl::Span<const float> piece = absl::MakeConstSpan(g).subspan(b, kPiece);
      // Reference: a residual of this piece only.
      v1::EncodedTensor t_whole, t_piece;
      ASSERT_TRUE(pieces.EncodeAt(b, piece, step * 10 + b, &t_piece).ok());
      ErrorFeedback one(codec.get(), kPiece, 0.5f);
      std::vector<float> e = Residual(whole);
      ASSERT_TRUE(one.SetResidual(absl::MakeConstSpan(e).subspan(b, kPiece)).ok());
      ASSERT_TRUE(one.Encode(piece, step * 10 + b, &t_whole).ok());
      EXPECT_EQ(t_piece.SerializeAsString(), t_whole.SerializeAsString());
      std::vector<float> next = Residual(one);
      std::copy(next.begin(), next.end(), e.begin() + b);
      ASSERT_TRUE(whole.SetResidual(e).ok());
    }
    EXPECT_EQ(Residual(pieces), Residual(whole));
  }
}

// The pieces' norms come from the encode: the in-place 1-bit kernel sums
// each block's squares in float lanes, so a sum over pieces agrees with a
// full pass in double to about 1e-7 (blocks of 256), not to the last bit.
TEST(ErrorFeedback, ResidualNormFromPiecesEqualsAFullPass) {
  auto codec = MustMake(v1::CODEC_ONEBIT, v1::CodecParams());
  ErrorFeedback ef(codec.get(), 1000);
  v1::EncodedTensor t;
  auto full = [&ef] {
    double sq = 0;
    for (float v : ef.residual()) sq += static_cast<double>(v) * v;
    return std::sqrt(sq);
  };
  // Half the stream encoded: the pieces do not cover it (a full pass).
  ASSERT_TRUE(ef.EncodeAt(0, RandomVector(500, 1), 1, &t).ok());
  EXPECT_NEAR(ef.ResidualNorm(), full(), 1e-6 * full());
  // Covered by two pieces, then cut differently (the old pieces forgotten).
  ASSERT_TRUE(ef.EncodeAt(500, RandomVector(500, 2), 2, &t).ok());
  EXPECT_NEAR(ef.ResidualNorm(), full(), 1e-6 * full());
  ASSERT_TRUE(ef.EncodeAt(250, RandomVector(500, 3), 3, &t).ok());
  EXPECT_NEAR(ef.ResidualNorm(), full(), 1e-6 * full());
  ASSERT_TRUE(ef.EncodeAt(0, RandomVector(250, 4), 4, &t).ok());
  ASSERT_TRUE(ef.EncodeAt(750, RandomVector(250, 5), 5, &t).ok());
  EXPECT_NEAR(ef.ResidualNorm(), full(), 1e-6 * full());
  ASSERT_TRUE(ef.SetResidual(RandomVector(1000, 6)).ok());
  EXPECT_NEAR(ef.ResidualNorm(), full(), 1e-6 * full());
  ef.Reset();
  EXPECT_EQ(ef.ResidualNorm(), 0.0);
}

TEST(ErrorFeedback, LosslessCodecNeverAllocatesAResidual) {
  auto codec = MustMake(v1::CODEC_FP32, v1::CodecParams());
  ErrorFeedback ef(codec.get(), 1000);
  v1::EncodedTensor t;
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(ef.EncodeAt(500, RandomVector(500, step), step, &t).ok());
  }
  EXPECT_TRUE(ef.residual().empty());
  EXPECT_EQ(ef.size(), 1000u);
  EXPECT_EQ(ef.ResidualNorm(), 0.0);
}

// The stateless step refuses bad buffers or decay before touching anything.
TEST_P(ErrorFeedbackAllCodecs, StatelessStepRefusesBadBuffersAndDecay) {
  auto codec = MustMake(GetParam().codec, GetParam().params);
  std::vector<float> g = RandomVector(64, 1), e_in = RandomVector(64, 2);
  std::vector<float> e_out(64, 7.0f), short_out(63, 7.0f);
  v1::EncodedTensor t;
  absl::Status s = EncodeWithFeedback(*codec, g, e_in, 1.0f, 0, &t,
                                      absl::MakeSpan(short_out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "error feedback buffers hold 64 and 63 elements; expected 64");
  s = EncodeWithFeedback(*codec, g, absl::MakeSpan(e_in).subspan(1), 1.0f, 0,
                         &t, absl::MakeSpan(e_out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  for (float decay : {NAN, INFINITY}) {
    s = EncodeWithFeedback(*codec, g, e_in, decay, 0, &t,
                           absl::MakeSpan(e_out));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("; expected a finite value"),
              std::string::npos) << s;
  }
  for (float x : e_out) ASSERT_EQ(x, 7.0f);
}

INSTANTIATE_TEST_SUITE_P(Codecs, ErrorFeedbackAllCodecs,
                         ::testing::ValuesIn(AllCodecCases()), CaseName);

TEST(ErrorFeedback, ResidualIsInputMinusDecoded) {
  auto codec = MustMake(v1::CODEC_ONEBIT);
  ErrorFeedback ef(codec.get(), 500, 0.5f);
  std::vector<float> e0 = RandomVector(500, 1, 0.2f);
  ASSERT_TRUE(ef.SetResidual(e0).ok());
  std::vector<float> g = RandomVector(500, 2);
  v1::EncodedTensor t;
  ASSERT_TRUE(ef.Encode(g, 0, &t).ok());
  std::vector<float> d(500);
  ASSERT_TRUE(codec->Decode(t, absl::MakeSpan(d)).ok());
  double norm = 0;
  for (size_t i = 0; i < 500; ++i) {
    float half = 0.5f * e0[i];
    float u = g[i] + half;
    ASSERT_EQ(ef.residual()[i], u - d[i]);
    norm += static_cast<double>(ef.residual()[i]) * ef.residual()[i];
  }
  // Summed per piece with four partial sums: not the same order.
  EXPECT_NEAR(ef.ResidualNorm(), std::sqrt(norm), 1e-12 * std::sqrt(norm));
}

// onebit, topk and block_topk offer a one-pass kernel; the wrapper runs the
// generic algorithm for the others. Both must give what encode-then-decode
// gives (codec_test's FusedFeedbackEqualsEncodeThenDecode checks every codec
// bit for bit; topk_test the sampled selection's paths, block_topk_test rows
// longer than its tiles).
TEST(ErrorFeedback, FusedKernelIsAnOptionalCapability) {
  for (v1::Codec c : {v1::CODEC_ONEBIT, v1::CODEC_TOPK, v1::CODEC_BLOCK_TOPK}) {
    EXPECT_NE(MustMake(c)->fused_feedback(), nullptr) << CodecName(c);
    EXPECT_NE(DecoderFor(c)->fused_feedback(), nullptr) << CodecName(c);
  }
  for (v1::Codec c : {v1::CODEC_FP32, v1::CODEC_FP16, v1::CODEC_BF16,
                      v1::CODEC_RANDOMK, v1::CODEC_QUANTIZE,
                      v1::CODEC_TOPK_QUANTIZE}) {
    EXPECT_EQ(MustMake(c)->fused_feedback(), nullptr) << CodecName(c);
  }
}

TEST(ErrorFeedback, SetResidualResetAndOwnership) {
  ErrorFeedback ef(MustMake(v1::CODEC_FP16), 4);
  EXPECT_EQ(ef.ResidualNorm(), 0.0);
  ASSERT_TRUE(ef.SetResidual(std::vector<float>{3, 4, 0, 0}).ok());
  EXPECT_DOUBLE_EQ(ef.ResidualNorm(), 5.0);
  EXPECT_EQ(ef.SetResidual(std::vector<float>{1, 2}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ef.SetResidual(std::vector<float>{1, NAN, 0, 0}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_DOUBLE_EQ(ef.ResidualNorm(), 5.0);
  ef.Reset();
  EXPECT_EQ(ef.ResidualNorm(), 0.0);
  v1::EncodedTensor t;
  ASSERT_TRUE(ef.Encode(std::vector<float>{1.0f, 2.0f, 1e-4f, 0.1f}, 0, &t).ok());
  EXPECT_EQ(t.codec(), v1::CODEC_FP16);
  EXPECT_GT(ef.ResidualNorm(), 0.0);  // 0.1 and 1e-4 are not exact in fp16
}

// A compression schedule switches codec mid-run: the residual of the old
// codec is sent by the new one (sum of decoded = sum of inputs - residual,
// across the switch), and UseCodec(nullptr) goes back to the first codec.
TEST(ErrorFeedback, UseCodecCarriesTheResidualAcrossCodecs) {
  auto topk = MustMake(v1::CODEC_TOPK);
  auto quantize = MustMake(v1::CODEC_QUANTIZE);
  constexpr size_t kN = 2000;
  ErrorFeedback ef(topk.get(), kN);
  std::vector<double> sent(kN, 0.0), input(kN, 0.0);
  std::vector<float> d(kN);
  v1::EncodedTensor t;
  for (int step = 0; step < 6; ++step) {
    if (step == 3) {
      const std::vector<float> before(ef.residual().begin(),
                                      ef.residual().end());
      ef.UseCodec(quantize.get());
      // Switching moves nothing.
      ASSERT_TRUE(std::equal(before.begin(), before.end(),
                             ef.residual().begin()));
    }
    std::vector<float> g = RandomVector(kN, 10 + step);
    ASSERT_TRUE(ef.Encode(g, step, &t).ok());
    EXPECT_EQ(t.codec(), step < 3 ? v1::CODEC_TOPK : v1::CODEC_QUANTIZE);
    ASSERT_TRUE(ef.codec().Decode(t, absl::MakeSpan(d)).ok());
    for (size_t i = 0; i < kN; ++i) {
      sent[i] += d[i];
      input[i] += g[i];
    }
  }
  // TopK at 1% left most of steps 0-2 in the residual; 8-bit quantize sends
  // nearly all of it, so the residual ends small.
  double residual_sq = 0, input_sq = 0;
  for (size_t i = 0; i < kN; ++i) {
    EXPECT_NEAR(sent[i] + ef.residual()[i], input[i], 1e-4) << i;
    residual_sq += double{ef.residual()[i]} * ef.residual()[i];
    input_sq += input[i] * input[i];
  }
  EXPECT_LT(std::sqrt(residual_sq), 0.05 * std::sqrt(input_sq));
  ef.UseCodec(nullptr);
  ASSERT_TRUE(ef.Encode(RandomVector(kN, 99), 7, &t).ok());
  EXPECT_EQ(t.codec(), v1::CODEC_TOPK);
}

}  // namespace
}  // namespace pserver

namespace pserver {
namespace {

// The 1-bit residual is updated in place once a piece's bound is known
// (from its second encode on): the payloads and residuals must be, bit for
// bit, those of the two-buffer kernel (EncodeWithFeedback), step after
// step, for whole streams and for pieces, with the l2 scale too.
TEST(ErrorFeedback, InPlaceOneBitIsTheTwoBufferKernelBitForBit) {
  for (v1::ScaleMode mode : {v1::SCALE_MODE_UNSPECIFIED, v1::SCALE_MODE_L2}) {
    v1::CodecParams params;
    params.set_scale_mode(mode);
    auto codec = MustMake(v1::CODEC_ONEBIT, params);
    const size_t n = 70000;  // blocks of 256 and a tail
    ErrorFeedback ef(codec.get(), n, 0.9f);
    std::vector<float> e(n, 0.0f), next(n);
    for (int step = 0; step < 4; ++step) {
      const std::vector<float> g = RandomVector(n, 40 + step);
      for (size_t b : {size_t{0}, size_t{30000}}) {
        const size_t len = b == 0 ? 30000 : n - 30000;
        v1::EncodedTensor got, want;
        const absl::Span<const float> piece =
            absl::MakeConstSpan(g).subspan(b, len);
        ASSERT_TRUE(ef.EncodeAt(b, piece, step * 7 + b, &got).ok());
        ASSERT_TRUE(EncodeWithFeedback(*codec, piece,
                                       absl::MakeConstSpan(e).subspan(b, len),
                                       0.9f, step * 7 + b, &want,
                                       absl::MakeSpan(next).subspan(b, len))
                        .ok());
        std::copy(next.begin() + b, next.begin() + b + len, e.begin() + b);
        EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString())
            << "step " << step << " piece " << b;
      }
      const std::vector<float> r = Residual(ef);
      EXPECT_EQ(std::memcmp(r.data(), e.data(), n * sizeof(float)), 0)
          << "step " << step;
    }
  }
}

// Where max|g| + |decay| ||e|| could overflow, the residual is not updated
// in place: a push whose u overflows in its second block is refused with
// the whole residual as it was, byte for byte (in place, the first block
// would already be rewritten).
TEST(ErrorFeedback, InPlaceIsSkippedWhereUCouldOverflow) {
  auto codec = MustMake(v1::CODEC_ONEBIT, v1::CodecParams());
  const size_t n = 1024;
  ErrorFeedback ef(codec.get(), n, 1.0f);
  v1::EncodedTensor t;
  std::vector<float> g = RandomVector(n, 1);
  g[300] = 2e38f;  // block 1: its residual stays near 2e38
  ASSERT_TRUE(ef.Encode(g, 1, &t).ok());
  // ||e|| ~ 2e38 is past the bound: this one goes through the scratch.
  ASSERT_TRUE(ef.Encode(RandomVector(n, 2), 2, &t).ok());
  const std::vector<float> before = Residual(ef);
  ASSERT_GT(before[300], 1e38f);
  g = RandomVector(n, 3);
  g[300] = 3e38f;  // finite, but 3e38 + 2e38 is not
  absl::Status s = ef.Encode(g, 3, &t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  const std::vector<float> after = Residual(ef);
  EXPECT_EQ(std::memcmp(after.data(), before.data(), n * sizeof(float)), 0);
  // Small values again (through the scratch buffer while the residual
  // holds 2e38): the two-buffer kernel's output.
  std::vector<float> next(n);
  v1::EncodedTensor want;
  const std::vector<float> small = RandomVector(n, 4);
  ASSERT_TRUE(ef.Encode(small, 4, &t).ok());
  ASSERT_TRUE(EncodeWithFeedback(*codec, small, before, 1.0f, 4, &want,
                                 absl::MakeSpan(next))
                  .ok());
  EXPECT_EQ(t.SerializeAsString(), want.SerializeAsString());
  const std::vector<float> r = Residual(ef);
  EXPECT_EQ(std::memcmp(r.data(), next.data(), n * sizeof(float)), 0);
}

// A caller's bound of max|g| (EncodeAt's `bound`) stands in for the pass
// that finds it: the exact max, a looser bound and +inf (none usable) give
// the payloads and residuals of a call without one, bit for bit, step after
// step, for whole streams and pieces; and with a correct bound the overflow
// of InPlaceIsSkippedWhereUCouldOverflow is still refused with the residual
// unchanged.
TEST(ErrorFeedback, ACallersBoundGivesTheSamePayloadsAndResiduals) {
  auto codec = MustMake(v1::CODEC_ONEBIT, v1::CodecParams());
  const size_t n = 70000;
  for (double loosen : {1.0, 4.0, double{INFINITY}}) {
    ErrorFeedback plain(codec.get(), n, 0.9f), bounded(codec.get(), n, 0.9f);
    for (int step = 0; step < 4; ++step) {
      const std::vector<float> g = RandomVector(n, 60 + step);
      for (size_t b : {size_t{0}, size_t{30000}}) {
        const size_t len = b == 0 ? 30000 : n - 30000;
        const absl::Span<const float> piece =
            absl::MakeConstSpan(g).subspan(b, len);
        v1::EncodedTensor want, got;
        ASSERT_TRUE(plain.EncodeAt(b, piece, step + b, &want).ok());
        ASSERT_TRUE(
            bounded.EncodeAt(b, piece, step + b, &got, MaxAbs(piece) * loosen)
                .ok());
        EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString())
            << "bound x" << loosen << " step " << step << " piece " << b;
      }
      const std::vector<float> a = Residual(plain), r = Residual(bounded);
      EXPECT_EQ(std::memcmp(a.data(), r.data(), n * sizeof(float)), 0)
          << "bound x" << loosen << " step " << step;
    }
  }
  ErrorFeedback ef(codec.get(), 1024, 1.0f);
  v1::EncodedTensor t;
  std::vector<float> g = RandomVector(1024, 1);
  g[300] = 2e38f;
  ASSERT_TRUE(ef.Encode(g, 1, &t).ok());
  ASSERT_TRUE(ef.EncodeAt(0, RandomVector(1024, 2), 2, &t, 5.0).ok());
  const std::vector<float> before = Residual(ef);
  g = RandomVector(1024, 3);
  g[300] = 3e38f;
  absl::Status s = ef.EncodeAt(0, g, 3, &t, MaxAbs(g));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  const std::vector<float> after = Residual(ef);
  EXPECT_EQ(std::memcmp(after.data(), before.data(), 1024 * sizeof(float)), 0);
}

}  // namespace
}  // namespace pserver
