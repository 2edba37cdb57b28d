// Counter-based randomness: every draw is a pure function of (seed, index),
// so encoders are reproducible and parallelisable, and a decoder can rebuild
// the same draws (randomk's index set). SplitMix64 (Steele et al. 2014).
#ifndef PSERVER_COMMON_INTERNAL_RNG_H_
#define PSERVER_COMMON_INTERNAL_RNG_H_

#include <cstdint>

#include "common/mix.h"

namespace pserver {
namespace internal {

using ::pserver::kGolden64;
using ::pserver::Mix64;

inline uint64_t SplitMix64(uint64_t x) { return Mix64(x + kGolden64); }

// A stream of 64-bit values indexed by counter: value i of stream `key`.
// Use StreamKey(seed) once, then Draw(key, i) per element.
inline uint64_t StreamKey(uint64_t seed) { return SplitMix64(seed); }
inline uint64_t Draw(uint64_t key, uint64_t index) {
  return Mix64(key + (index + 1) * kGolden64);
}

// Uniform in [0, 1) on a 2^-24 grid (exact in fp32 and fp64).
inline float UnitFloat(uint64_t bits) {
  return static_cast<float>(bits >> 40) * 5.9604644775390625e-8f;
}

// Uniform integer in [0, m) by multiply-high (Lemire); bias <= m / 2^64.
inline uint64_t Below(uint64_t bits, uint64_t m) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(bits) * m) >>
                               64);
}

}  // namespace internal
}  // namespace pserver

#endif  // PSERVER_COMMON_INTERNAL_RNG_H_
