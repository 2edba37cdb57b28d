// The codec measurement (tune/codec_profile.h) on tensors whose answer is
// known by hand.
#include "tune/codec_profile.h"

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "common/error_feedback.h"
#include "common/mix.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/codec_test_util.h"

namespace pserver {
namespace {

using testing_util::MustMake;
using testing_util::RandomVector;

std::vector<absl::Span<const float>> Spans(
    const std::vector<std::vector<float>>& v) {
  return std::vector<absl::Span<const float>>(v.begin(), v.end());
}

ProfileOptions Quick() {
  ProfileOptions o;
  o.repetitions = 3;
  o.min_timed_seconds = 1e-4;
  return o;
}

TEST(CodecProfile, Fp32IsExactAtRatioOne) {
  std::vector<std::vector<float>> g = {RandomVector(1000, 1),
                                       RandomVector(1000, 2)};
  auto codec = MustMake(v1::CODEC_FP32);
  absl::StatusOr<CodecProfile> p = ProfileCodec(*codec, Spans(g), Quick());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->steps(), 2u);
  EXPECT_EQ(p->elements, 1000u);
  EXPECT_EQ(p->mean_bytes(), 4000.0);
  EXPECT_EQ(p->ratio(), 1.0);
  EXPECT_EQ(p->rel_error(), 0.0);
  EXPECT_EQ(p->window_error(), 0.0);
  EXPECT_EQ(p->ef_step_error(), 0.0);
  EXPECT_EQ(p->ef_window_error(), 0.0);
  EXPECT_GT(p->encode_elements_per_second(), 0.0);
  EXPECT_GT(p->ef_encode_elements_per_second(), 0.0);
  EXPECT_GT(p->decode_elements_per_second(), 0.0);
}

// Signs with one magnitude: the mean |u| scale reproduces them exactly, at
// 256 * 4 bytes / (one scale + 32 bytes of signs).
TEST(CodecProfile, OnebitOnConstantMagnitudeIsExact) {
  std::vector<float> g(256);
  for (size_t i = 0; i < g.size(); ++i) g[i] = (i * 7 % 3 == 0) ? 0.5f : -0.5f;
  std::vector<std::vector<float>> steps = {g, g, g};
  v1::CodecParams params;
  params.set_block_size(256);
  auto codec = MustMake(v1::CODEC_ONEBIT, params);
  absl::StatusOr<CodecProfile> p = ProfileCodec(*codec, Spans(steps), Quick());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->mean_bytes(), 36.0);
  EXPECT_DOUBLE_EQ(p->ratio(), 1024.0 / 36.0);
  EXPECT_EQ(p->rel_error(), 0.0);
  EXPECT_EQ(p->ef_window_error(), 0.0);
}

// Alternating 3 and 1: one block decodes to the mean 2 everywhere, off by 1
// in each element: ||(1, -1, ...)|| / ||(3, 1, ...)|| = 1 / sqrt(5), and the
// window without feedback is off by the same fraction.
TEST(CodecProfile, OnebitErrorIsTheDistanceToTheBlockMean) {
  std::vector<float> g(64);
  for (size_t i = 0; i < g.size(); ++i) g[i] = i % 2 == 0 ? 3.0f : 1.0f;
  std::vector<std::vector<float>> steps = {g, g};
  v1::CodecParams params;
  params.set_block_size(0);
  auto codec = MustMake(v1::CODEC_ONEBIT, params);
  absl::StatusOr<CodecProfile> p = ProfileCodec(*codec, Spans(steps), Quick());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NEAR(p->rel_error(), 1 / std::sqrt(5.0), 1e-12);
  EXPECT_NEAR(p->window_error(), 1 / std::sqrt(5.0), 1e-12);
}

// g = (1, 1) every step, top-1 (lower index wins ties). Without feedback
// every step sends (1, 0): the window misses half of it, error 1/sqrt(2).
// With feedback the sent element alternates, (1,0) (0,2) (2,0) (0,2), and
// the residual stays at norm 1: the window error is 1 / ||(4, 4)||; per
// step 1/sqrt(2) first, then ||(1,-1)|| / ||(1,1)|| = 1.
TEST(CodecProfile, TopKWithFeedbackDelaysInsteadOfLosing) {
  std::vector<std::vector<float>> steps(4, std::vector<float>{1.0f, 1.0f});
  v1::CodecParams params;
  params.set_k(1);
  params.set_selection(v1::TOPK_SELECTION_EXACT);
  auto codec = MustMake(v1::CODEC_TOPK, params);
  absl::StatusOr<CodecProfile> p = ProfileCodec(*codec, Spans(steps), Quick());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NEAR(p->rel_error(), 1 / std::sqrt(2.0), 1e-12);
  EXPECT_NEAR(p->window_error(), 1 / std::sqrt(2.0), 1e-12);
  EXPECT_NEAR(p->ef_window_error(), 1 / std::sqrt(32.0), 1e-12);
  EXPECT_NEAR(p->ef_step_error(), (1 / std::sqrt(2.0) + 3) / 4, 1e-12);
}

// With decay 1 the window error under feedback is the residual left after
// the window, over the window's sum (an independent ErrorFeedback run).
TEST(CodecProfile, EfWindowErrorIsTheResidualOverTheSum) {
  std::vector<std::vector<float>> steps;
  for (uint32_t t = 0; t < 6; ++t) steps.push_back(RandomVector(3000, 10 + t));
  v1::CodecParams params;
  params.set_bits(2);
  auto codec = MustMake(v1::CODEC_QUANTIZE, params);
  ProfileOptions o = Quick();
  absl::StatusOr<CodecProfile> p = ProfileCodec(*codec, Spans(steps), o);
  ASSERT_TRUE(p.ok()) << p.status();

  ErrorFeedback ef(codec.get(), 3000);
  v1::EncodedTensor out;
  std::vector<double> sum(3000, 0.0);
  for (size_t t = 0; t < steps.size(); ++t) {
    ASSERT_TRUE(ef.Encode(steps[t], MixPair(o.seed, t), &out).ok());
    for (size_t i = 0; i < 3000; ++i) sum[i] += steps[t][i];
  }
  double e_sq = 0, s_sq = 0;
  for (size_t i = 0; i < 3000; ++i) {
    e_sq += static_cast<double>(ef.residual()[i]) * ef.residual()[i];
    s_sq += sum[i] * sum[i];
  }
  EXPECT_NEAR(p->ef_window_error(), std::sqrt(e_sq / s_sq), 1e-5);
  // Feedback keeps the window far closer than independent rounding does.
  EXPECT_LT(p->ef_window_error(), p->window_error() / 2);
  EXPECT_GT(p->rel_error(), 0.0);
}

// An elementwise codec measured on two halves and combined gives the
// figures of the whole.
TEST(CodecProfile, CombinedHalvesEqualTheWhole) {
  std::vector<std::vector<float>> whole, a, b;
  for (uint32_t t = 0; t < 3; ++t) {
    whole.push_back(RandomVector(2000, 40 + t));
    a.emplace_back(whole[t].begin(), whole[t].begin() + 700);
    b.emplace_back(whole[t].begin() + 700, whole[t].end());
  }
  auto codec = MustMake(v1::CODEC_BF16);
  auto pw = ProfileCodec(*codec, Spans(whole), Quick());
  auto pa = ProfileCodec(*codec, Spans(a), Quick());
  auto pb = ProfileCodec(*codec, Spans(b), Quick());
  ASSERT_TRUE(pw.ok() && pa.ok() && pb.ok());
  absl::StatusOr<CodecProfile> c = CombineProfiles({*pa, *pb});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->elements, 2000u);
  EXPECT_EQ(c->mean_bytes(), pw->mean_bytes());
  EXPECT_EQ(c->ratio(), 2.0);
  EXPECT_NEAR(c->rel_error(), pw->rel_error(), 1e-9 * pw->rel_error());
  EXPECT_NEAR(c->window_error(), pw->window_error(), 1e-9 * pw->window_error());
  EXPECT_NEAR(c->ef_window_error(), pw->ef_window_error(),
              1e-9 * pw->ef_window_error());
  EXPECT_GT(pw->rel_error(), 0.0);
  EXPECT_GT(c->encode_seconds, 0.0);
  EXPECT_DOUBLE_EQ(c->encode_seconds, pa->encode_seconds + pb->encode_seconds);
  EXPECT_DOUBLE_EQ(c->ef_encode_seconds,
                   pa->ef_encode_seconds + pb->ef_encode_seconds);

  auto short_window = ProfileCodec(*codec, Spans({a[0], a[1]}), Quick());
  ASSERT_TRUE(short_window.ok());
  absl::StatusOr<CodecProfile> bad = CombineProfiles({*pa, *short_window});
  EXPECT_THAT(bad.status().message(),
              ::testing::HasSubstr("parts[1] covers 2 steps; expected 3"));
  EXPECT_FALSE(CombineProfiles({}).ok());
}

TEST(CodecProfile, BadInputIsRefusedNamingTheField) {
  auto codec = MustMake(v1::CODEC_FP16);
  std::vector<float> x(8, 1.0f), y(9, 1.0f), empty;
  auto bad = ProfileCodec(*codec, {}, Quick());
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("steps is empty"));
  bad = ProfileCodec(*codec, Spans({x, y}), Quick());
  EXPECT_THAT(bad.status().message(),
              ::testing::HasSubstr("steps[1] has 9 elements; expected 8"));
  bad = ProfileCodec(*codec, Spans({empty}), Quick());
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("steps[0] is empty"));
  ProfileOptions o = Quick();
  o.repetitions = 0;
  bad = ProfileCodec(*codec, Spans({x}), o);
  EXPECT_THAT(bad.status().message(),
              ::testing::HasSubstr("repetitions is 0; expected >= 1"));
  std::vector<float> nan = x;
  nan[3] = std::numeric_limits<float>::quiet_NaN();
  bad = ProfileCodec(*codec, Spans({nan}), Quick());
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
}

TEST(CodecProfile, RelativeNormOfZeros) {
  EXPECT_EQ(RelativeNorm(0, 0), 0.0);
  EXPECT_TRUE(std::isinf(RelativeNorm(1, 0)));
  EXPECT_EQ(RelativeNorm(4, 16), 0.5);
}

// Every sweep entry builds, labels are unique, and every codec ParseCodecName
// knows is in it.
TEST(CodecSweep, EveryCandidateBuildsUnderAUniqueLabel) {
  std::set<std::string> labels;
  std::set<v1::Codec> codecs;
  for (const CodecCandidate& c : CodecSweep()) {
    EXPECT_TRUE(labels.insert(c.label).second) << c.label;
    codecs.insert(c.codec);
    EXPECT_FALSE(c.family.empty()) << c.label;
    EXPECT_TRUE(MakeCodec(c.codec, c.params).ok()) << c.label;
  }
  for (v1::Codec c : NamedCodecs()) EXPECT_TRUE(codecs.count(c)) << CodecName(c);
}

}  // namespace
}  // namespace pserver
