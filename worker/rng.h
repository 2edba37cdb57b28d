// Small deterministic random number generation for the worker: SplitMix64
// (Steele, Lea, Flood, OOPSLA 2014) and Box-Muller normals. Written by hand
// rather than taken from <random> distributions so that a seed gives the same
// numbers with every standard library.
#ifndef PSERVER_WORKER_RNG_H_
#define PSERVER_WORKER_RNG_H_

#include <cmath>
#include <cstdint>

#include "common/mix.h"

namespace pserver {

// Derives an independent seed from a base seed and a stream number (an epoch,
// a tensor index, ...).
inline uint64_t DeriveSeed(uint64_t seed, uint64_t stream) {
  return Mix64(seed ^ Mix64(stream + 0x632BE59BD9B4E019ULL));
}

// SplitMix64 generator. Not thread-safe; cheap to copy.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    state_ += kGolden64;
    return Mix64(state_);
  }

  // Uniform in [0, 1) with 53 random bits.
  double NextDouble() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

  // Uniform integer in [0, bound), unbiased (Lemire's multiply-shift with
  // rejection). REQUIRES: bound > 0.
  uint64_t Uniform(uint64_t bound) {
    unsigned __int128 m = static_cast<unsigned __int128>(Next()) * bound;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < bound) {
      const uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(Next()) * bound;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

  // Standard normal by the Box-Muller transform; both values of a pair are
  // used.
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    // 1 - u lies in (0, 1], so the log is finite.
    const double u1 = 1.0 - NextDouble();
    const double u2 = NextDouble();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 6.283185307179586476925 * u2;
    spare_ = r * std::sin(theta);
    has_spare_ = true;
    return r * std::cos(theta);
  }

 private:
  uint64_t state_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace pserver

#endif  // PSERVER_WORKER_RNG_H_
