#include "common/norms.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/internal/cpu.h"

namespace pserver {
namespace {

constexpr uint64_t kMinChunk = uint64_t{1} << 16;

// term(i) for i in [b, e), summed in 8 lanes, the lanes in a fixed tree.
template <typename Term>
double Lanes(uint64_t b, uint64_t e, Term term) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  uint64_t i = b;
  for (; i + 8 <= e; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += term(i + k);
  }
  for (int k = 0; i < e; ++i, ++k) acc[k] += term(i);
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) +
         ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

template <typename Term>
double Parallel(uint64_t n, ThreadPool* pool, Term term) {
  std::vector<double> part(static_cast<size_t>(pool->helpers()) + 1, 0.0);
  const uint64_t chunk = std::max<uint64_t>(1, n / part.size());
  pool->ParallelFor(n, kMinChunk, [&](uint64_t b, uint64_t e) {
    part[std::min<uint64_t>(b / chunk, part.size() - 1)] = Lanes(b, e, term);
  });
  double total = 0;
  for (double p : part) total += p;
  return total;
}

PSERVER_CLONES_AVX2 uint32_t MaxAbsBits(const float* v, size_t n) {
  uint32_t top = 0;
  for (size_t i = 0; i < n; ++i) top = std::max(top, AbsBits(v[i]));
  return top;
}

}  // namespace

double MaxAbsOfBits(uint32_t top) {
  if (top >= 0x7F800000u) return std::numeric_limits<double>::infinity();
  float m;
  std::memcpy(&m, &top, sizeof(m));
  return m;
}

double MaxAbs(absl::Span<const float> v) {
  return MaxAbsOfBits(MaxAbsBits(v.data(), v.size()));
}

double SquaredNorm(absl::Span<const float> v, ThreadPool* pool) {
  const float* p = v.data();
  return Parallel(v.size(), pool, [p](uint64_t i) {
    const double x = p[i];
    return x * x;
  });
}

double SquaredDistance(absl::Span<const float> a, absl::Span<const float> b,
                       ThreadPool* pool) {
  const float* pa = a.data();
  const float* pb = b.data();
  return Parallel(std::min(a.size(), b.size()), pool, [pa, pb](uint64_t i) {
    const double d = double{pa[i]} - pb[i];
    return d * d;
  });
}

}  // namespace pserver
