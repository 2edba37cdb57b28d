// SquaredNorm / SquaredDistance: the sums of squares of the daemons' norm
// gauges, against a serial long-double sum, the same on every call.
#include "common/norms.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace pserver {
namespace {

std::vector<float> Values(size_t n, float scale, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t z = 0x9E3779B97F4A7C15ULL * (seed + 1);
  for (float& f : v) {
    z ^= z << 13;
    z ^= z >> 7;
    z ^= z << 17;
    f = scale * (static_cast<float>(z >> 40) / (1 << 24) - 0.5f);
  }
  return v;
}

TEST(Norms, MatchSerialSumsForEverySizeAndPool) {
  ThreadPool none(0), one(1), three(3);
  for (size_t n : {0, 1, 7, 8, 9, 1000, (1 << 17) + 3, (1 << 19) + 11}) {
    SCOPED_TRACE(n);
    const std::vector<float> a = Values(n, 3.0f, 1), b = Values(n, 1e3f, 2);
    long double sa = 0, sd = 0;
    for (size_t i = 0; i < n; ++i) {
      sa += static_cast<long double>(a[i]) * a[i];
      const long double d = static_cast<long double>(a[i]) - b[i];
      sd += d * d;
    }
    for (ThreadPool* pool : {&none, &one, &three}) {
      const double na = SquaredNorm(a, pool), nd = SquaredDistance(a, b, pool);
      EXPECT_NEAR(na, static_cast<double>(sa), 1e-12 * static_cast<double>(sa));
      EXPECT_NEAR(nd, static_cast<double>(sd), 1e-12 * static_cast<double>(sd));
      // A fixed order: the same bits on every call with the same pool.
      EXPECT_EQ(SquaredNorm(a, pool), na);
      EXPECT_EQ(SquaredDistance(a, b, pool), nd);
    }
  }
  // x - x: zero, and a large value's square does not overflow float.
  const std::vector<float> big(5, 3e30f);
  EXPECT_EQ(SquaredDistance(big, big, &one), 0.0);
  const double sq = 5 * (double{3e30f} * double{3e30f});
  EXPECT_NEAR(SquaredNorm(big, &one), sq, 1e-15 * sq);
}

TEST(Norms, MaxAbsIsTheLargestMagnitudeOrInfinity) {
  EXPECT_EQ(MaxAbs({}), 0.0);
  std::vector<float> v = Values(1001, 6.0f, 3);
  double want = 0;
  for (float f : v) want = std::max(want, double{std::fabs(f)});
  EXPECT_EQ(MaxAbs(v), want);
  v[500] = -3e38f;
  EXPECT_EQ(MaxAbs(v), double{3e38f});
  for (float bad : {std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    v[777] = bad;
    EXPECT_TRUE(std::isinf(MaxAbs(v))) << bad;
  }
}

}  // namespace
}  // namespace pserver
