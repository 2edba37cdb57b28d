// The one 64-bit mixer of the project: SplitMix64's output function (Steele,
// Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014),
// a bijection on 64-bit words whose output bits each depend on every input
// bit. Seeds of encoders, pull deltas, data order and counter-based draws are
// all derived through it, so one seed gives the same numbers everywhere.
// Pure functions: safe from any thread.
#ifndef PSERVER_COMMON_MIX_H_
#define PSERVER_COMMON_MIX_H_

#include <cstdint>

namespace pserver {

// 2^64 / golden ratio: SplitMix64's state increment (Weyl sequence).
inline constexpr uint64_t kGolden64 = 0x9E3779B97F4A7C15ULL;

// z -> mix(z): (z ^ z>>30) * C1, (z ^ z>>27) * C2, z ^ z>>31.
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Mix64 of an ordered pair: Mix64(a * kGolden64 + b + C). MixPair(a, b) and
// MixPair(b, a) differ.
inline uint64_t MixPair(uint64_t a, uint64_t b) {
  return Mix64(a * kGolden64 + b + 0x632BE59BD9B4E019ULL);
}

}  // namespace pserver

#endif  // PSERVER_COMMON_MIX_H_
