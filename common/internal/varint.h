// LEB128 varints (7 bits per byte, low group first, high bit = more), as
// protobuf encodes uint64. Decoding is bounds-checked for untrusted input.
#ifndef PSERVER_COMMON_INTERNAL_VARINT_H_
#define PSERVER_COMMON_INTERNAL_VARINT_H_

#include <cstdint>
#include <string>

namespace pserver {
namespace internal {

inline constexpr int kMaxVarintBytes = 10;

// Writes v at p, returns the end. REQUIRES: kMaxVarintBytes of room.
inline uint8_t* PutVarint(uint64_t v, uint8_t* p) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

enum class VarintResult { kOk, kTruncated, kOverflow };

// Reads one varint from [*p, end), advancing *p on success.
inline VarintResult GetVarint(const uint8_t** p, const uint8_t* end,
                              uint64_t* v) {
  const uint8_t* q = *p;
  uint64_t result = 0;
  for (int i = 0; i < kMaxVarintBytes; ++i) {
    if (q == end) return VarintResult::kTruncated;
    uint8_t byte = *q++;
    if (i == kMaxVarintBytes - 1 && byte > 1) return VarintResult::kOverflow;
    result |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
    if (!(byte & 0x80)) {
      *p = q;
      *v = result;
      return VarintResult::kOk;
    }
  }
  return VarintResult::kOverflow;
}

}  // namespace internal
}  // namespace pserver

#endif  // PSERVER_COMMON_INTERNAL_VARINT_H_
