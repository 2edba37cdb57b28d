#include <algorithm>
#include <cstring>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/codec.h"
#include "common/error_feedback.h"
#include "common/impl/topk_select.h"
#include "common/internal/cpu.h"
#include "gtest/gtest.h"
#include "tests/common/codec_test_util.h"

namespace pserver {
namespace {

using testing_util::MustMake;
using testing_util::RandomVector;

// Slow reference: sort positions by |u| descending, ties by lower index.
std::vector<uint64_t> ReferenceTopK(const std::vector<float>& u, size_t k) {
  std::vector<uint64_t> pos(u.size());
  std::iota(pos.begin(), pos.end(), 0);
  std::stable_sort(pos.begin(), pos.end(), [&](uint64_t a, uint64_t b) {
    return std::fabs(u[a]) > std::fabs(u[b]);
  });
  pos.resize(k);
  std::sort(pos.begin(), pos.end());
  return pos;
}

// Decodes and returns the positions present in the payload, via the codec.
std::vector<uint64_t> DecodedSupport(const Codec& codec, const v1::EncodedTensor& t,
                                     std::vector<float>* d) {
  d->assign(t.num_elements(), 0.0f);
  EXPECT_TRUE(codec.Decode(t, absl::MakeSpan(*d)).ok());
  // Parse the varint count and gaps by hand (the wire format).
  const std::string& p = t.payload();
  size_t at = 0;
  auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      uint8_t b = static_cast<uint8_t>(p[at++]);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
  };
  uint64_t count = varint();
  std::vector<uint64_t> idx;
  for (uint64_t j = 0; j < count; ++j) {
    uint64_t gap = varint();
    idx.push_back(j == 0 ? gap : idx.back() + gap + 1);
  }
  return idx;
}

v1::CodecParams Exact(uint64_t k, double fraction = 0) {
  v1::CodecParams p;
  p.set_k(k);
  if (fraction > 0) p.set_k_fraction(fraction);
  p.set_selection(v1::TOPK_SELECTION_EXACT);
  return p;
}

TEST(TopKCodec, ExactMatchesReferenceIncludingTies) {
  for (size_t n : {1, 7, 255, 257, 1000, 4097, 70000}) {
    for (bool ties : {false, true}) {
      std::vector<float> u = RandomVector(n, static_cast<uint32_t>(n));
      if (ties) {
        for (float& x : u) x = std::round(x * 2) / 2;  // few distinct |u|
      }
      for (size_t k : {size_t{1}, n / 3 + 1, n}) {
        SCOPED_TRACE(::testing::Message() << n << " " << ties << " " << k);
        auto codec = MustMake(v1::CODEC_TOPK, Exact(k));
        v1::EncodedTensor t;
        ASSERT_TRUE(codec->Encode(u, 0, &t).ok());
        EXPECT_EQ(t.params().k(), k);
        std::vector<float> d;
        std::vector<uint64_t> idx = DecodedSupport(*codec, t, &d);
        ASSERT_EQ(idx, ReferenceTopK(u, k));
        std::vector<float> want(n, 0.0f);
        for (uint64_t i : idx) want[i] = u[i];
        ASSERT_EQ(d, want);
      }
    }
  }
}

TEST(TopKCodec, KFromFractionOrCount) {
  std::vector<float> u = RandomVector(1000, 1);
  struct Case { uint64_t k; double f; uint64_t want; };
  for (Case c : {Case{0, 0.01, 10}, Case{0, 0.0004, 1}, Case{0, 0.0015, 2},
                 Case{0, 1.0, 1000}, Case{5, 0.5, 5}, Case{5000, 0, 1000}}) {
    auto codec = MustMake(v1::CODEC_TOPK, Exact(c.k, c.f));
    v1::EncodedTensor t;
    ASSERT_TRUE(codec->Encode(u, 0, &t).ok());
    std::vector<float> d;
    EXPECT_EQ(DecodedSupport(*codec, t, &d).size(), c.want) << c.k << " " << c.f;
  }
}

TEST(TopKCodec, Fp16ValuesRoundToNearest) {
  std::vector<float> u = RandomVector(500, 2);
  v1::CodecParams p = Exact(50);
  p.set_value_format(v1::VALUE_FORMAT_FP16);
  auto codec = MustMake(v1::CODEC_TOPK, p);
  v1::EncodedTensor t;
  ASSERT_TRUE(codec->Encode(u, 0, &t).ok());
  std::vector<float> d;
  std::vector<uint64_t> idx = DecodedSupport(*codec, t, &d);
  ASSERT_EQ(idx, ReferenceTopK(u, 50));
  for (uint64_t i : idx) EXPECT_NEAR(d[i], u[i], std::fabs(u[i]) * 0x1p-11);
}

TEST(TopKCodec, SampledKeepsTopSetWithinTenPercent) {
  for (size_t n : {size_t{1} << 17, size_t{1} << 20}) {
    std::vector<float> u = RandomVector(n, 9);
    v1::CodecParams p;  // sampled, 1%
    auto codec = MustMake(v1::CODEC_TOPK, p);
    v1::EncodedTensor t, t_scalar;
    ASSERT_TRUE(codec->Encode(u, 0, &t).ok());
    std::vector<float> d;
    std::vector<uint64_t> idx = DecodedSupport(*codec, t, &d);
    const double k = std::round(0.01 * n);
    EXPECT_GE(idx.size(), 0.9 * k);
    EXPECT_LE(idx.size(), 1.1 * k);
    // It is the exact top-c set for its own c.
    EXPECT_EQ(idx, ReferenceTopK(u, idx.size()));
    internal::ForceScalarKernelsForTesting(true);
    ASSERT_TRUE(codec->Encode(u, 0, &t_scalar).ok());
    internal::ForceScalarKernelsForTesting(false);
    EXPECT_EQ(t.payload(), t_scalar.payload());
  }
}

TEST(TopKCodec, SampledFallsBackToExactOnHeavyTies) {
  const size_t n = 1 << 17;
  std::vector<float> u = RandomVector(n, 4, 0.01f);
  for (size_t i = 0; i < n; i += 2) u[i] = (i % 4 ? 1.0f : -1.0f);  // half tie
  auto codec = MustMake(v1::CODEC_TOPK, {});
  v1::EncodedTensor t;
  ASSERT_TRUE(codec->Encode(u, 0, &t).ok());
  std::vector<float> d;
  EXPECT_EQ(DecodedSupport(*codec, t, &d), ReferenceTopK(u, 1311));
}

// The fused error-feedback kernel (EncodeWithFeedback) against the generic
// algorithm (u = g + decay * e, Encode(u), e = u - Decode), bit for bit, on
// each path of the sampled selection, with the AVX2 and scalar kernels, fp32
// and fp16 values, aligned and unaligned residual buffers. Scaling the
// inputs at the sample's positions steers the filter pass: by 0.97 it keeps
// about 1.3 k candidates (exact refinement among them), by 1.05 about 0.75 k
// (too few: exact selection on everything), by 0.9 about 1.9 k (more than
// the candidate buffer holds: exact selection too); ties keep half of u.
TEST(TopKCodec, FusedFeedbackMatchesGenericOnEverySampledPath) {
  const size_t n = (size_t{1} << 17) + 5;
  const impl::SamplePlan plan(n);
  struct Case {
    const char* name;
    float sample_scale;
    bool ties;
  };
  for (Case c : {Case{"kept", 1.0f, false}, Case{"refined", 0.97f, false},
                 Case{"too_few", 1.05f, false}, Case{"too_many", 0.9f, false},
                 Case{"ties", 1.0f, true}}) {
    std::vector<float> g = RandomVector(n, 21), e = RandomVector(n, 22, 0.3f);
    for (size_t j = 0; j < plan.m; ++j) {
      g[plan.Position(j)] *= c.sample_scale;
      e[plan.Position(j)] *= c.sample_scale;
    }
    if (c.ties) {
      for (size_t i = 0; i < n; i += 2) g[i] = (i % 4 ? 1.0f : -1.0f);
    }
    std::vector<float> u(n);
    for (size_t i = 0; i < n; ++i) {
      float d = 0.75f * e[i];
      u[i] = g[i] + d;
    }
    for (v1::ValueFormat f : {v1::VALUE_FORMAT_FP32, v1::VALUE_FORMAT_FP16}) {
      v1::CodecParams p;
      p.set_value_format(f);
      auto codec = MustMake(v1::CODEC_TOPK, p);
      v1::EncodedTensor plain;
      ASSERT_TRUE(codec->Encode(u, 3, &plain).ok());
      std::vector<float> want(n);
      ASSERT_TRUE(codec->Decode(plain, absl::MakeSpan(want)).ok());
      for (size_t i = 0; i < n; ++i) want[i] = u[i] - want[i];
      std::vector<float> d;
      const size_t count = DecodedSupport(*codec, plain, &d).size();
      if (c.sample_scale != 1.0f || c.ties) {
        EXPECT_EQ(count, 1311u) << c.name;  // refined or exact: exactly k
      }
      for (bool scalar : {false, true}) {
        for (size_t offset : {0, 1}) {
          SCOPED_TRACE(::testing::Message() << c.name << " " << f << " "
                                            << scalar << " " << offset);
          internal::ForceScalarKernelsForTesting(scalar);
          std::vector<float> out(n + 1, 7.0f);
          v1::EncodedTensor t;
          absl::Status s = EncodeWithFeedback(
              *codec, g, e, 0.75f, 3, &t,
              absl::MakeSpan(out).subspan(offset, n));
          internal::ForceScalarKernelsForTesting(false);
          ASSERT_TRUE(s.ok()) << s;
          EXPECT_EQ(t.SerializeAsString(), plain.SerializeAsString());
          ASSERT_EQ(0, std::memcmp(out.data() + offset, want.data(), n * 4));
        }
      }
    }
  }
}

// Large calls write their residuals with non-temporal stores (aligned
// buffers) or ordinary ones: same bytes as the generic algorithm.
TEST(TopKCodec, FusedFeedbackOnLargeTensors) {
  const size_t n = (size_t{1} << 22) + 9;
  std::vector<float> g = RandomVector(n, 31), e = RandomVector(n, 32, 0.3f);
  std::vector<float> u(n);
  for (size_t i = 0; i < n; ++i) u[i] = g[i] + e[i];
  auto codec = MustMake(v1::CODEC_TOPK);
  v1::EncodedTensor plain;
  ASSERT_TRUE(codec->Encode(u, 0, &plain).ok());
  std::vector<float> want(n);
  ASSERT_TRUE(codec->Decode(plain, absl::MakeSpan(want)).ok());
  for (size_t i = 0; i < n; ++i) want[i] = u[i] - want[i];
  for (size_t offset : {0, 1}) {
    std::vector<float> out(n + 1, 7.0f);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(out.data()) % 16, 0u);
    v1::EncodedTensor t;
    ASSERT_TRUE(EncodeWithFeedback(*codec, g, e, 1.0f, 0, &t,
                                   absl::MakeSpan(out).subspan(offset, n))
                    .ok());
    EXPECT_EQ(t.payload(), plain.payload()) << offset;
    ASSERT_EQ(0, std::memcmp(out.data() + offset, want.data(), n * 4))
        << offset;
  }
}

// Non-finite input on the sampled path: Encode and the fused kernel name
// the first non-finite u_i, with either kernel, wherever it lies.
TEST(TopKCodec, SampledRejectsNonFiniteNamingTheFirst) {
  const size_t n = size_t{1} << 17;
  auto codec = MustMake(v1::CODEC_TOPK);
  for (bool scalar : {false, true}) {
    for (size_t at : {size_t{5}, n / 2, n - 1}) {
      SCOPED_TRACE(::testing::Message() << scalar << " " << at);
      std::vector<float> g = RandomVector(n, 41), e = RandomVector(n, 42);
      g[at] = NAN;
      g[n - 2] = INFINITY;
      std::vector<float> u(n), out(n);
      for (size_t i = 0; i < n; ++i) u[i] = g[i] + e[i];
      const std::string want =
          "input element " + std::to_string(std::min(at, n - 2)) + " ";
      internal::ForceScalarKernelsForTesting(scalar);
      v1::EncodedTensor t;
      absl::Status fused = EncodeWithFeedback(*codec, g, e, 1.0f, 0, &t,
                                              absl::MakeSpan(out));
      absl::Status plain = codec->Encode(u, 0, &t);
      internal::ForceScalarKernelsForTesting(false);
      EXPECT_EQ(fused.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(fused.message().find(want), std::string::npos) << fused;
      EXPECT_EQ(plain.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(plain.message().find(want), std::string::npos) << plain;
    }
  }
}

TEST(TopKCodec, ExactWithOneHugeBucket) {
  // Over 2^20 equal keys in one histogram bucket: the second-level path.
  const size_t n = (1 << 20) + 5000;
  std::vector<float> u(n, 0.0f);
  for (size_t i = 0; i < n; i += 4000) u[i] = 1.0f + i * 1e-6f;
  auto codec = MustMake(v1::CODEC_TOPK, Exact(1000));
  v1::EncodedTensor t;
  ASSERT_TRUE(codec->Encode(u, 0, &t).ok());
  std::vector<float> d;
  EXPECT_EQ(DecodedSupport(*codec, t, &d), ReferenceTopK(u, 1000));
}

}  // namespace
}  // namespace pserver
