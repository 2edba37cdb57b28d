// Private to common/: one value on the wire as fp32, fp16 or bf16 (IEEE
// binary32, binary16, bfloat16; little-endian). The dense float codecs and the
// values of topk/randomk payloads share these kernels, templated on the format
// so that the per-element loops carry no format branch.
#ifndef PSERVER_COMMON_IMPL_WIRE_SCALAR_H_
#define PSERVER_COMMON_IMPL_WIRE_SCALAR_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/types/span.h"
#include "common/internal/float16.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "payloads are little-endian; add byte swaps for this target");

namespace pserver {
namespace impl {

enum class Scalar { kFp32, kFp16, kBf16 };

template <Scalar S>
constexpr size_t kScalarBytes = S == Scalar::kFp32 ? 4 : 2;

template <Scalar S>
inline bool ScalarIsFinite(const uint8_t* p) {
  if constexpr (S == Scalar::kFp32) {
    uint32_t b;
    std::memcpy(&b, p, 4);
    return (b & 0x7f800000) != 0x7f800000;
  } else {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return S == Scalar::kFp16 ? internal::HalfIsFinite(h)
                              : internal::Bf16IsFinite(h);
  }
}

// REQUIRES: ScalarIsFinite<S>(p).
template <Scalar S>
inline float LoadScalar(const uint8_t* p) {
  if constexpr (S == Scalar::kFp32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  } else {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return S == Scalar::kFp16 ? internal::HalfToFloat(h)
                              : internal::Bf16ToFloat(h);
  }
}

// Appends v as S values (narrowing rounds to nearest even and saturates).
// Appends rather than growing the string first, which would zero-fill it.
// REQUIRES: every v[i] is finite.
template <Scalar S>
void AppendScalars(absl::Span<const float> v, std::string* out) {
  if constexpr (S == Scalar::kFp32) {
    if (!v.empty()) {
      out->append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
    }
  } else {
    out->reserve(out->size() + v.size() * 2);
    constexpr size_t kChunk = 512;
    uint16_t half[kChunk];
    for (size_t b = 0; b < v.size(); b += kChunk) {
      const size_t len = std::min(kChunk, v.size() - b);
      for (size_t i = 0; i < len; ++i) {
        half[i] = S == Scalar::kFp16 ? internal::FloatToHalf(v[b + i])
                                     : internal::FloatToBf16(v[b + i]);
      }
      out->append(reinterpret_cast<const char*>(half), len * 2);
    }
  }
}

// Index of the first non-finite of the `count` values at p, or count.
template <Scalar S>
uint64_t FirstNonFiniteScalar(const uint8_t* p, uint64_t count) {
  for (uint64_t i = 0; i < count; ++i) {
    if (!ScalarIsFinite<S>(p + i * kScalarBytes<S>)) return i;
  }
  return count;
}

// acc[i] += alpha * value i for i < n. REQUIRES: the n values are finite.
template <Scalar S>
void AccumulateScalars(const uint8_t* p, size_t n, float alpha, float* acc) {
  for (size_t i = 0; i < n; ++i) {
    acc[i] += alpha * LoadScalar<S>(p + i * kScalarBytes<S>);
  }
}

}  // namespace impl
}  // namespace pserver

#endif  // PSERVER_COMMON_IMPL_WIRE_SCALAR_H_
