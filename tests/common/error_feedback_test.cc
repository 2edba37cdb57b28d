#include "common/error_feedback.h"

#include <cmath>
#include <cstring>
#include <vector>

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
  for (size_t i = 0; i < kN; ++i) {
    worst = std::max(worst, std::fabs(sum_out[i] + ef.residual()[i] - sum_in[i]));
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
  std::vector<float> before(ef.residual().begin(), ef.residual().end());
  std::vector<float> g = RandomVector(300, 9);
  g[3] = NAN;
  absl::Status s = ef.Encode(g, 4, &t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(0, std::memcmp(before.data(), ef.residual().data(), 300 * 4));
  s = ef.Encode(RandomVector(299, 1), 4, &t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(0, std::memcmp(before.data(), ef.residual().data(), 300 * 4));
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
  EXPECT_DOUBLE_EQ(ef.ResidualNorm(), std::sqrt(norm));
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

}  // namespace
}  // namespace pserver
