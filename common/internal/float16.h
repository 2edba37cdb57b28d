// fp32 <-> IEEE binary16 and bfloat16 conversion, round to nearest even,
// saturating finite values at the largest finite value of the narrow format.
// Integer-only, so the result does not depend on the FP environment.
// REQUIRES for the narrowing functions: the input is finite.
#ifndef PSERVER_COMMON_INTERNAL_FLOAT16_H_
#define PSERVER_COMMON_INTERNAL_FLOAT16_H_

#include <cstdint>
#include <cstring>

namespace pserver {
namespace internal {

inline uint32_t FloatBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

inline float BitsFloat(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

// Rounds `value >> shift` to nearest, ties to even. REQUIRES 1 <= shift < 32.
inline uint32_t ShiftRoundEven(uint32_t value, int shift) {
  uint32_t r = value >> shift;
  uint32_t rem = value & ((uint32_t{1} << shift) - 1);
  uint32_t half = uint32_t{1} << (shift - 1);
  if (rem > half || (rem == half && (r & 1))) ++r;
  return r;
}

inline uint16_t FloatToHalf(float f) {
  uint32_t bits = FloatBits(f);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  uint32_t abs = bits & 0x7fffffff;
  // 65520 = 65504 + half an ulp: the tie rounds to even, i.e. to infinity.
  if (abs >= 0x477ff000) return sign | 0x7bff;
  if (abs >= 0x38800000) {  // normal half (>= 2^-14)
    uint32_t rebased = abs - 0x38000000;  // exponent bias 127 -> 15
    return sign | static_cast<uint16_t>(ShiftRoundEven(rebased, 13));
  }
  uint32_t exp = abs >> 23;
  if (exp < 102) return sign;  // below 2^-25: rounds to zero
  // Subnormal half: value / 2^-24 = mantissa * 2^(exp - 126).
  uint32_t mant = (abs & 0x7fffff) | 0x800000;
  return sign | static_cast<uint16_t>(ShiftRoundEven(mant, 126 - exp));
}

inline bool HalfIsFinite(uint16_t h) { return (h & 0x7c00) != 0x7c00; }

// REQUIRES: HalfIsFinite(h).
inline float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0) {
    // Subnormal or zero: mant * 2^-24, exact in fp32.
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return BitsFloat(FloatBits(v) | sign);
  }
  return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t FloatToBf16(float f) {
  uint32_t bits = FloatBits(f);
  uint32_t rounded = bits + 0x7fff + ((bits >> 16) & 1);
  uint16_t h = static_cast<uint16_t>(rounded >> 16);
  if ((h & 0x7f80) == 0x7f80) {  // rounded up to infinity: saturate
    return static_cast<uint16_t>((bits >> 16) & 0x8000) | 0x7f7f;
  }
  return h;
}

inline bool Bf16IsFinite(uint16_t h) { return (h & 0x7f80) != 0x7f80; }

inline float Bf16ToFloat(uint16_t h) {
  return BitsFloat(static_cast<uint32_t>(h) << 16);
}

}  // namespace internal
}  // namespace pserver

#endif  // PSERVER_COMMON_INTERNAL_FLOAT16_H_
