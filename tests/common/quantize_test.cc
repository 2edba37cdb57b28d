// quantize, randomk and topk_quantize against slow references.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <vector>

#include "common/codec.h"
#include "gtest/gtest.h"
#include "tests/common/codec_test_util.h"

namespace pserver {
namespace {

using testing_util::MustMake;
using testing_util::RandomVector;

v1::CodecParams Q(uint32_t bits, bool adaptive, bool stochastic, uint32_t block = 256) {
  v1::CodecParams p;
  p.set_bits(bits);
  p.set_block_size(block);
  if (adaptive) p.set_range(v1::QUANTIZE_RANGE_ADAPTIVE);
  if (stochastic) p.set_rounding(v1::ROUNDING_STOCHASTIC);
  return p;
}

// Reference range of a block: (lo, hi) for linear, (-c, c) for adaptive with
// c the nearest-rank percentile of |u|.
std::pair<double, double> RefRange(const float* u, size_t len, bool adaptive, double pct) {
  if (!adaptive) {
    auto [lo, hi] = std::minmax_element(u, u + len);
    return {*lo, *hi};
  }
  std::vector<double> a;
  for (size_t i = 0; i < len; ++i) a.push_back(std::fabs(u[i]));
  std::sort(a.begin(), a.end());
  size_t rank = static_cast<size_t>(std::ceil(pct / 100.0 * len));
  rank = std::clamp<size_t>(rank, 1, len);
  return {-a[rank - 1], a[rank - 1]};
}

TEST(QuantizeCodec, NearestMatchesReference) {
  for (uint32_t bits = 2; bits <= 8; ++bits) {
    for (bool adaptive : {false, true}) {
      for (size_t n : {1, 7, 255, 257, 1000}) {
        SCOPED_TRACE(::testing::Message() << bits << " " << adaptive << " " << n);
        std::vector<float> u = RandomVector(n, bits * 100 + n);
        auto codec = MustMake(v1::CODEC_QUANTIZE, Q(bits, adaptive, false));
        v1::EncodedTensor t;
        ASSERT_TRUE(codec->Encode(u, 0, &t).ok());
        const size_t blocks = (n + 255) / 256;
        ASSERT_EQ(t.payload().size(), blocks * (adaptive ? 4 : 8) + (n * bits + 7) / 8);
        std::vector<float> d(n);
        ASSERT_TRUE(codec->Decode(t, absl::MakeSpan(d)).ok());
        const double levels = (1 << bits) - 1;
        for (size_t b0 = 0; b0 < n; b0 += 256) {
          size_t len = std::min<size_t>(256, n - b0);
          auto [lo, hi] = RefRange(&u[b0], len, adaptive, 99);
          double step = (hi - lo) / levels;
          for (size_t i = b0; i < b0 + len; ++i) {
            double x = std::clamp<double>(u[i], lo, hi);
            double q = step > 0 ? std::floor((x - lo) / step + 0.5) : 0;
            double want = lo + std::clamp(q, 0.0, levels) * step;
            ASSERT_NEAR(d[i], want, 1e-6 * (std::fabs(want) + 1)) << i;
            ASSERT_LE(std::fabs(d[i] - x), step / 2 * (1 + 1e-6) + 1e-7) << i;
          }
        }
      }
    }
  }
}

TEST(QuantizeCodec, StochasticRoundingIsUnbiased) {
  // E[decode] = clip(u): average many encodings with different seeds.
  for (bool adaptive : {false, true}) {
    const size_t n = 512;
    std::vector<float> u = RandomVector(n, 21);
    u[3] = 8.0f;  // an outlier the adaptive range clips
    auto codec = MustMake(v1::CODEC_QUANTIZE, Q(2, adaptive, true));
    const int kTrials = 4000;
    std::vector<double> mean(n, 0.0);
    std::vector<float> d(n);
    v1::EncodedTensor t;
    for (int s = 0; s < kTrials; ++s) {
      ASSERT_TRUE(codec->Encode(u, 1000 + s, &t).ok());
      ASSERT_TRUE(codec->Decode(t, absl::MakeSpan(d)).ok());
      for (size_t i = 0; i < n; ++i) mean[i] += d[i] / kTrials;
    }
    double worst_z = 0;
    for (size_t b0 = 0; b0 < n; b0 += 256) {
      auto [lo, hi] = RefRange(&u[b0], 256, adaptive, 99);
      double step = (hi - lo) / 3;
      for (size_t i = b0; i < b0 + 256; ++i) {
        double x = std::clamp<double>(u[i], lo, hi);
        // Bernoulli rounding: variance <= step^2 / 4 per trial.
        double sigma = step / 2 / std::sqrt(kTrials);
        worst_z = std::max(worst_z, std::fabs(mean[i] - x) / sigma);
      }
    }
    EXPECT_LT(worst_z, 5.0) << "adaptive " << adaptive;
  }
}

TEST(QuantizeCodec, StochasticIsReproducibleFromSeed) {
  std::vector<float> u = RandomVector(1000, 3);
  auto codec = MustMake(v1::CODEC_QUANTIZE, Q(3, false, true));
  v1::EncodedTensor a, b, c;
  ASSERT_TRUE(codec->Encode(u, 7, &a).ok());
  ASSERT_TRUE(codec->Encode(u, 7, &b).ok());
  ASSERT_TRUE(codec->Encode(u, 8, &c).ok());
  EXPECT_EQ(a.payload(), b.payload());
  EXPECT_NE(a.payload(), c.payload());
}

TEST(QuantizeCodec, ConstantBlockIsExact) {
  std::vector<float> u(300, 0.375f);
  auto codec = MustMake(v1::CODEC_QUANTIZE, Q(2, false, true));
  v1::EncodedTensor t;
  ASSERT_TRUE(codec->Encode(u, 1, &t).ok());
  std::vector<float> d(300);
  ASSERT_TRUE(codec->Decode(t, absl::MakeSpan(d)).ok());
  for (float x : d) ASSERT_EQ(x, 0.375f);
}

TEST(RandomKCodec, IndexSetIsPureAndUniform) {
  const size_t n = 1000, k = 100;
  v1::CodecParams p;
  p.set_k(k);
  auto codec = MustMake(v1::CODEC_RANDOMK, p);
  std::vector<float> u(n);
  std::iota(u.begin(), u.end(), 1.0f);  // value i+1 identifies position i
  std::vector<int> hits(n, 0);
  const int kTrials = 2000;
  for (int s = 0; s < kTrials; ++s) {
    v1::EncodedTensor t, again;
    ASSERT_TRUE(codec->Encode(u, s, &t).ok());
    ASSERT_TRUE(codec->Encode(u, s, &again).ok());
    ASSERT_EQ(t.SerializeAsString(), again.SerializeAsString());
    ASSERT_EQ(t.params().k(), k);
    ASSERT_EQ(t.payload().size(), k * 4);
    // Values in increasing index order = the u values at the index set.
    std::vector<float> vals(k);
    std::memcpy(vals.data(), t.payload().data(), k * 4);
    ASSERT_TRUE(std::is_sorted(vals.begin(), vals.end()));
    ASSERT_EQ(std::set<float>(vals.begin(), vals.end()).size(), k);
    std::vector<float> d(n);
    ASSERT_TRUE(codec->Decode(t, absl::MakeSpan(d)).ok());
    for (float v : vals) ASSERT_EQ(d[static_cast<size_t>(v) - 1], v);
    for (float v : vals) ++hits[static_cast<size_t>(v) - 1];
  }
  // Each position is kept with probability k / n = 0.1.
  double expect = kTrials * 0.1, sigma = std::sqrt(kTrials * 0.1 * 0.9);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(hits[i], expect, 5 * sigma) << i;
}

TEST(RandomKCodec, UnbiasedScalesByNOverK) {
  const size_t n = 200;
  v1::CodecParams p;
  p.set_k(50);
  p.set_unbiased(true);
  auto codec = MustMake(v1::CODEC_RANDOMK, p);
  std::vector<float> u = RandomVector(n, 5);
  std::vector<double> mean(n, 0.0);
  std::vector<float> d(n);
  const int kTrials = 20000;
  for (int s = 0; s < kTrials; ++s) {
    v1::EncodedTensor t;
    ASSERT_TRUE(codec->Encode(u, s, &t).ok());
    ASSERT_TRUE(codec->Decode(t, absl::MakeSpan(d)).ok());
    for (size_t i = 0; i < n; ++i) {
      if (d[i] != 0) {
        ASSERT_EQ(d[i], u[i] * 4.0f);
      }
      mean[i] += d[i] / kTrials;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    double sigma = std::fabs(u[i]) * std::sqrt(3.0 / kTrials);  // 4u Bernoulli(1/4)
    ASSERT_NEAR(mean[i], u[i], 5 * sigma + 1e-6) << i;
  }
}

TEST(TopKQuantizeCodec, TopKIndicesWithQuantizedValues) {
  for (size_t n : {1, 300, 4097}) {
    std::vector<float> u = RandomVector(n, 6);
    v1::CodecParams p;
    p.set_k(std::max<size_t>(1, n / 10));
    p.set_bits(8);
    p.set_selection(v1::TOPK_SELECTION_EXACT);
    auto codec = MustMake(v1::CODEC_TOPK_QUANTIZE, p);
    v1::EncodedTensor t;
    ASSERT_TRUE(codec->Encode(u, 0, &t).ok());
    std::vector<float> d(n);
    ASSERT_TRUE(codec->Decode(t, absl::MakeSpan(d)).ok());
    // Reference selection: |u| descending, ties by index.
    std::vector<size_t> pos(n);
    std::iota(pos.begin(), pos.end(), 0);
    std::stable_sort(pos.begin(), pos.end(),
                     [&](size_t a, size_t b) { return std::fabs(u[a]) > std::fabs(u[b]); });
    pos.resize(p.k());
    std::vector<float> sel;
    std::sort(pos.begin(), pos.end());
    for (size_t i : pos) sel.push_back(u[i]);
    std::vector<bool> chosen(n, false);
    for (size_t i : pos) chosen[i] = true;
    for (size_t i = 0; i < n; ++i) {
      if (!chosen[i]) {
        ASSERT_EQ(d[i], 0.0f) << i;
      }
    }
    // Values: 8-bit linear over blocks of the selected values.
    for (size_t b0 = 0; b0 < sel.size(); b0 += 256) {
      size_t len = std::min<size_t>(256, sel.size() - b0);
      auto [lo, hi] = std::minmax_element(sel.begin() + b0, sel.begin() + b0 + len);
      double step = (static_cast<double>(*hi) - *lo) / 255;
      for (size_t j = b0; j < b0 + len; ++j) {
        ASSERT_LE(std::fabs(d[pos[j]] - sel[j]), step / 2 * (1 + 1e-6) + 1e-7);
      }
    }
  }
}

}  // namespace
}  // namespace pserver
