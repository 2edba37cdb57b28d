// Sums of squares over model-sized vectors for the norms the daemons export
// (the shard's momentum and replica-residual norms): in double, on a thread
// pool, in a fixed order. Element i of a chunk goes to lane i % 8 and the
// lanes add in a fixed tree, so the loop has no serial dependence (one
// double add chain would take ~4 cycles an element, 0.2 s per 100M); the
// chunks are those of ThreadPool::ParallelFor, added in order, so a result
// depends only on the size and the pool's helpers, never on timing.
#ifndef PSERVER_COMMON_NORMS_H_
#define PSERVER_COMMON_NORMS_H_

#include <cstdint>
#include <cstring>

#include "absl/types/span.h"
#include "common/thread_pool.h"

namespace pserver {

// sum_i v[i]^2.
double SquaredNorm(absl::Span<const float> v, ThreadPool* pool);

// sum_i (a[i] - b[i])^2, the difference taken in double (exact).
// REQUIRES: a.size() == b.size().
double SquaredDistance(absl::Span<const float> a, absl::Span<const float> b,
                       ThreadPool* pool);

// max_i |v[i]|, +inf if any v[i] is not finite (0 for an empty span): the
// compare runs on the bits (|v| is v without its sign bit, ordered as an
// integer; a non-finite value's exponent is all ones), so one vectorized
// pass serves as the finite check too.
double MaxAbs(absl::Span<const float> v);

// |x|'s bits (x without its sign bit): for the loops that write a vector
// and take its MaxAbs in the same pass, `top = max(top, AbsBits(x))`.
inline uint32_t AbsBits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits & 0x7FFFFFFFu;
}
// MaxAbs from the largest AbsBits of the values (+inf if it is a non-finite
// value's).
double MaxAbsOfBits(uint32_t top);

}  // namespace pserver

#endif  // PSERVER_COMMON_NORMS_H_
