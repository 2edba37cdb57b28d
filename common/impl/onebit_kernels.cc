// The onebit kernels (contract in onebit_kernels.h): a scalar one and an AVX2
// one per direction, which give bit-identical output: sums run over 8 lanes
// (element j of a block goes to lane j % 8) reduced in one fixed tree, and
// no multiply-add is fused (-ffp-contract=off, no FMA intrinsics).
#include "common/impl/onebit_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "common/impl/codecs.h"
#include "common/internal/cpu.h"

namespace pserver {
namespace impl {
namespace {

using Layout = OneBitLayout;
using EncodeArgs = OneBitInput;

inline float InputAt(const EncodeArgs& a, uint64_t i) {
  if (!a.e_in) return a.g[i];
  float d = a.decay * a.e_in[i];
  return a.g[i] + d;
}

// Block scales sit at an arbitrary offset in the payload: read and write
// them through memcpy rather than through an aligned copy.
inline float LoadScale(const uint8_t* scales, uint64_t b) {
  float s;
  std::memcpy(&s, scales + 4 * b, 4);
  return s;
}
inline void StoreScale(uint8_t* scales, uint64_t b, float s) {
  std::memcpy(scales + 4 * b, &s, 4);
}

// Fixed reduction tree over the 8 lanes, mirrored by the AVX2 kernel.
inline float ReduceLanes(const float s[8]) {
  float t0 = s[0] + s[4], t1 = s[1] + s[5], t2 = s[2] + s[6],
        t3 = s[3] + s[7];
  return (t0 + t2) + (t1 + t3);
}

// The scale from a block's lane sum; recomputed in double if the fp32 sum
// overflowed (finite inputs near FLT_MAX). `u` holds the block's inputs.
float FinishScale(float sum, const float* u, uint64_t len, bool l2) {
  if (!std::isfinite(sum)) {
    double d = 0;
    for (uint64_t j = 0; j < len; ++j) {
      d += l2 ? static_cast<double>(u[j]) * u[j] : std::fabs(u[j]);
    }
    double mean = d / static_cast<double>(len);
    return static_cast<float>(l2 ? std::sqrt(mean) : mean);
  }
  float mean = sum / static_cast<float>(len);
  return l2 ? std::sqrt(mean) : mean;
}

absl::Status FirstBadInBlock(const EncodeArgs& a, uint64_t b0, uint64_t b1) {
  for (uint64_t i = b0; i < b1; ++i) {
    float u = InputAt(a, i);
    if (!std::isfinite(u)) return NonFiniteInput(i, u);
  }
  return NonFiniteInput(b0, 0.0f);  // unreachable
}

// Signs and residual for elements [i0, i1) of a block with scale s, one
// element at a time (the scalar kernel, and the tails of the AVX2 one).
// With e_out, adds each residual's square to lanes[(i - b0) & 7] (b0: the
// block's first element).
inline void SignsScalar(const float* src, float* e_out, uint8_t* signs,
                        float s, uint64_t i0, uint64_t i1, uint64_t b0,
                        float* lanes) {
  for (uint64_t i = i0; i < i1; ++i) {
    float u = src[i];
    bool pos = u >= 0.0f;
    if (pos) signs[i >> 3] |= static_cast<uint8_t>(1u << (i & 7));
    if (e_out) {
      float r = u - (pos ? s : -s);
      e_out[i] = r;
      lanes[(i - b0) & 7] += r * r;
    }
  }
}

absl::Status EncodeScalar(const EncodeArgs& a, uint64_t n, const Layout& l,
                          uint8_t* scales, uint8_t* signs) {
  const float* src = a.e_out ? a.e_out : a.g;
  double e_sq = 0;
  for (uint64_t b = 0; b < l.blocks; ++b) {
    uint64_t b0 = b * l.block, b1 = std::min(n, b0 + l.block);
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    bool bad = false;
    for (uint64_t i = b0; i < b1; ++i) {
      float u = InputAt(a, i);
      float m = std::fabs(u);
      bad |= !(m <= FLT_MAX);
      if (a.e_out) a.e_out[i] = u;
      lanes[(i - b0) & 7] += a.l2 ? u * u : m;
    }
    if (bad) return FirstBadInBlock(a, b0, b1);
    float s = FinishScale(ReduceLanes(lanes), src + b0, b1 - b0, a.l2);
    StoreScale(scales, b, s);
    float sq[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    SignsScalar(src, a.e_out, signs, s, b0, b1, b0, sq);
    e_sq += ReduceLanes(sq);
  }
  if (a.e_sq != nullptr) *a.e_sq = e_sq;
  return absl::OkStatus();
}

// out[i] = base[i] + alpha * decode(i); base may be out. kZero: base[i] is
// 0.0f (base is not read), still added, so that -0.0 comes out +0.0 as it
// does from a zero-filled buffer.
template <bool kZero>
void AccumulateScalar(const uint8_t* scales, const uint8_t* signs, uint64_t n,
                      const Layout& l, float alpha, const float* base,
                      float* out) {
  for (uint64_t b = 0; b < l.blocks; ++b) {
    uint64_t b0 = b * l.block, b1 = std::min(n, b0 + l.block);
    float pos = alpha * LoadScale(scales, b);
    float neg = -pos;
    for (uint64_t i = b0; i < b1; ++i) {
      out[i] = (kZero ? 0.0f : base[i]) +
               (((signs[i >> 3] >> (i & 7)) & 1) ? pos : neg);
    }
  }
}

#if defined(__x86_64__)
#define PSERVER_AVX2 __attribute__((target("avx2,fma")))

// Blocks up to this many elements keep their inputs u in a stack buffer
// between the sum pass and the sign pass (u = g + decay * e_in is formed
// once, and e_out is written once); longer blocks use e_out for that.
constexpr uint64_t kBufferedBlock = 2048;
// Residuals of a call at least this large (bytes) are written with
// non-temporal stores: they are not read again before the next step, and
// bypassing the cache saves the read-for-ownership of every line (a third
// of the memory traffic of encode + error feedback). Smaller outputs stay
// cached (a 32 MiB L3 holds g, e_in and e_out of 2M elements).
constexpr uint64_t kStreamBytes = uint64_t{16} << 20;

// Sign bits of the 8 elements src[at..at+8) (bit j: element at + j is >= 0)
// and, with error feedback, their residuals u - (+-s) into e_out.
template <bool kEf, bool kStream>
PSERVER_AVX2 inline __attribute__((always_inline)) uint32_t Signs8(
    const float* src, float* e_out, uint64_t at, __m256 vpos, __m256 vneg,
    __m256* sq) {
  __m256 u = _mm256_loadu_ps(src + at);
  __m256 ge = _mm256_cmp_ps(u, _mm256_setzero_ps(), _CMP_GE_OQ);
  if (kEf) {
    __m256 r = _mm256_sub_ps(u, _mm256_blendv_ps(vneg, vpos, ge));
    *sq = _mm256_add_ps(*sq, _mm256_mul_ps(r, r));
    if (kStream) {
      _mm_stream_ps(e_out + at, _mm256_castps256_ps128(r));
      _mm_stream_ps(e_out + at + 4, _mm256_extractf128_ps(r, 1));
    } else {
      _mm256_storeu_ps(e_out + at, r);
    }
  }
  return static_cast<uint32_t>(_mm256_movemask_ps(ge));
}

// REQUIRES: every block starts at a multiple of 8; with kStream, e_out is
// 16-byte aligned and blocks are at most kBufferedBlock long. Templated so
// that the inner loops carry no mode branches and keep pointers in
// registers.
template <bool kEf, bool kL2, bool kStream>
PSERVER_AVX2 absl::Status EncodeAvx2(const EncodeArgs& a, uint64_t n,
                                     const Layout& l, uint8_t* scales,
                                     uint8_t* signs) {
  const float* const g = a.g;
  const float* const e_in = a.e_in;
  float* const e_out = a.e_out;
  const __m256 vdecay = _mm256_set1_ps(a.decay);
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 vmax = _mm256_set1_ps(FLT_MAX);
  const __m256 zero = _mm256_setzero_ps();
  const uint64_t block = l.block, blocks = l.blocks;
  const bool buffered = kEf && block <= kBufferedBlock;
  alignas(32) float ubuf[kEf ? kBufferedBlock : 8];
  [[maybe_unused]] double e_sq = 0;
  for (uint64_t b = 0; b < blocks; ++b) {
    const uint64_t b0 = b * block, b1 = std::min(n, b0 + block);
    // Where this block's u lives for the sign pass, indexed by i - off.
    float* const u_at = !kEf ? nullptr : buffered ? ubuf : e_out + b0;
    __m256 sum = zero, bad = zero;
    uint64_t i = b0;
    for (; i + 8 <= b1; i += 8) {
      __m256 u = _mm256_loadu_ps(g + i);
      if (kEf) {
        u = _mm256_add_ps(u, _mm256_mul_ps(vdecay, _mm256_loadu_ps(e_in + i)));
        _mm256_storeu_ps(u_at + (i - b0), u);
      }
      __m256 m = _mm256_and_ps(u, absmask);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(m, vmax, _CMP_NLE_UQ));
      sum = _mm256_add_ps(sum, kL2 ? _mm256_mul_ps(u, u) : m);
    }
    if (i < b1) {  // tail: masked lanes read as 0 and add 0 to their sums
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      __m256i mask = _mm256_cmpgt_epi32(
          _mm256_set1_epi32(static_cast<int>(b1 - i)), lane);
      __m256 u = _mm256_maskload_ps(g + i, mask);
      if (kEf) {
        u = _mm256_add_ps(
            u, _mm256_mul_ps(vdecay, _mm256_maskload_ps(e_in + i, mask)));
        _mm256_maskstore_ps(u_at + (i - b0), mask, u);
      }
      __m256 m = _mm256_and_ps(u, absmask);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(m, vmax, _CMP_NLE_UQ));
      sum = _mm256_add_ps(sum, kL2 ? _mm256_mul_ps(u, u) : m);
    }
    if (_mm256_movemask_ps(bad)) {
      if (kStream) _mm_sfence();
      return FirstBadInBlock(a, b0, b1);
    }
    // Same tree as ReduceLanes: (s_j + s_{j+4}), then (t0 + t2) + (t1 + t3).
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(sum),
                          _mm256_extractf128_ps(sum, 1));
    __m128 w = _mm_add_ps(t, _mm_movehl_ps(t, t));
    float total = _mm_cvtss_f32(
        _mm_add_ss(w, _mm_shuffle_ps(w, w, _MM_SHUFFLE(1, 1, 1, 1))));
    const float* const src = kEf ? u_at - b0 : g;  // src[i]: u of element i
    const float s = FinishScale(total, src + b0, b1 - b0, kL2);
    StoreScale(scales, b, s);
    const __m256 vpos = _mm256_set1_ps(s), vneg = _mm256_set1_ps(-s);
    // The residuals' squares, lane j % 8 (blocks start at multiples of 8).
    __m256 sq = zero;
    i = b0;
    for (; i + 32 <= b1; i += 32) {  // one 4-byte store per 32 signs
      uint32_t m0 = Signs8<kEf, kStream>(src, e_out, i, vpos, vneg, &sq);
      uint32_t m1 = Signs8<kEf, kStream>(src, e_out, i + 8, vpos, vneg, &sq);
      uint32_t m2 = Signs8<kEf, kStream>(src, e_out, i + 16, vpos, vneg, &sq);
      uint32_t m3 = Signs8<kEf, kStream>(src, e_out, i + 24, vpos, vneg, &sq);
      uint32_t m = m0 | m1 << 8 | m2 << 16 | m3 << 24;
      std::memcpy(signs + (i >> 3), &m, 4);
    }
    for (; i + 8 <= b1; i += 8) {
      signs[i >> 3] = static_cast<uint8_t>(
          Signs8<kEf, kStream>(src, e_out, i, vpos, vneg, &sq));
    }
    if (kEf) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, sq);
      // The tail's u is in src; SignsScalar reads src and writes e_out.
      SignsScalar(src, e_out, signs, s, i, b1, b0, lanes);
      e_sq += ReduceLanes(lanes);
    } else if (i < b1) {
      SignsScalar(src, nullptr, signs, s, i, b1, b0, nullptr);
    }
  }
  if (kEf && a.e_sq != nullptr) *a.e_sq = e_sq;
  // Non-temporal stores are weakly ordered: fence them before whoever
  // synchronises with this thread reads e_out.
  if (kStream) _mm_sfence();
  return absl::OkStatus();
}

absl::Status EncodeAvx2Dispatch(const EncodeArgs& a, uint64_t n,
                                const Layout& l, uint8_t* scales,
                                uint8_t* signs) {
  if (a.e_in) {
    const bool stream =
        n * sizeof(float) >= kStreamBytes && l.block <= kBufferedBlock &&
        reinterpret_cast<uintptr_t>(a.e_out) % 16 == 0;
    if (stream) {
      return a.l2 ? EncodeAvx2<true, true, true>(a, n, l, scales, signs)
                  : EncodeAvx2<true, false, true>(a, n, l, scales, signs);
    }
    return a.l2 ? EncodeAvx2<true, true, false>(a, n, l, scales, signs)
                : EncodeAvx2<true, false, false>(a, n, l, scales, signs);
  }
  return a.l2 ? EncodeAvx2<false, true, false>(a, n, l, scales, signs)
              : EncodeAvx2<false, false, false>(a, n, l, scales, signs);
}

// As AccumulateScalar, bit for bit. REQUIRES: every block starts at a
// multiple of 8.
template <bool kZero>
PSERVER_AVX2 void AccumulateAvx2(const uint8_t* scales, const uint8_t* signs,
                                 uint64_t n, const Layout& l, float alpha,
                                 const float* base, float* out) {
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 zero = _mm256_setzero_ps();
  auto load = [base, zero](uint64_t i) PSERVER_AVX2 {
    return kZero ? zero : _mm256_loadu_ps(base + i);
  };
  for (uint64_t b = 0; b < l.blocks; ++b) {
    const uint64_t b0 = b * l.block, b1 = std::min(n, b0 + l.block);
    const float pos = alpha * LoadScale(scales, b);
    const __m256 vpos = _mm256_set1_ps(pos), vneg = _mm256_set1_ps(-pos);
    uint64_t i = b0;
    for (; i + 16 <= b1; i += 16) {
      __m256i m0 = _mm256_set1_epi32(signs[i >> 3]);
      __m256i m1 = _mm256_set1_epi32(signs[(i >> 3) + 1]);
      m0 = _mm256_cmpeq_epi32(_mm256_and_si256(m0, bit), bit);
      m1 = _mm256_cmpeq_epi32(_mm256_and_si256(m1, bit), bit);
      __m256 v0 = _mm256_blendv_ps(vneg, vpos, _mm256_castsi256_ps(m0));
      __m256 v1 = _mm256_blendv_ps(vneg, vpos, _mm256_castsi256_ps(m1));
      _mm256_storeu_ps(out + i, _mm256_add_ps(load(i), v0));
      _mm256_storeu_ps(out + i + 8, _mm256_add_ps(load(i + 8), v1));
    }
    for (; i + 8 <= b1; i += 8) {
      __m256i m0 = _mm256_set1_epi32(signs[i >> 3]);
      m0 = _mm256_cmpeq_epi32(_mm256_and_si256(m0, bit), bit);
      __m256 v0 = _mm256_blendv_ps(vneg, vpos, _mm256_castsi256_ps(m0));
      _mm256_storeu_ps(out + i, _mm256_add_ps(load(i), v0));
    }
    for (; i < b1; ++i) {
      out[i] = (kZero ? 0.0f : base[i]) +
               (((signs[i >> 3] >> (i & 7)) & 1) ? pos : -pos);
    }
  }
}
#endif

bool AvxUsable(const Layout& l) {
#if defined(__x86_64__)
  return (l.block % 8 == 0 || l.blocks <= 1) && internal::UseAvx2();
#else
  return false;
#endif
}

}  // namespace

absl::Status OneBitEncode(const OneBitInput& a, uint64_t n,
                          const OneBitLayout& l, uint8_t* scales,
                          uint8_t* signs) {
#if defined(__x86_64__)
  if (AvxUsable(l)) return EncodeAvx2Dispatch(a, n, l, scales, signs);
#endif
  return EncodeScalar(a, n, l, scales, signs);
}

void OneBitAccumulate(const uint8_t* scales, const uint8_t* signs, uint64_t n,
                      const OneBitLayout& l, float alpha, float* acc) {
  OneBitAddTo(scales, signs, n, l, alpha, acc, acc);
}

void OneBitAddTo(const uint8_t* scales, const uint8_t* signs, uint64_t n,
                 const OneBitLayout& l, float alpha, const float* base,
                 float* out) {
#if defined(__x86_64__)
  if (AvxUsable(l)) {
    AccumulateAvx2<false>(scales, signs, n, l, alpha, base, out);
    return;
  }
#endif
  AccumulateScalar<false>(scales, signs, n, l, alpha, base, out);
}

void OneBitAssign(const uint8_t* scales, const uint8_t* signs, uint64_t n,
                  const OneBitLayout& l, float alpha, float* out) {
#if defined(__x86_64__)
  if (AvxUsable(l)) {
    AccumulateAvx2<true>(scales, signs, n, l, alpha, nullptr, out);
    return;
  }
#endif
  AccumulateScalar<true>(scales, signs, n, l, alpha, nullptr, out);
}

}  // namespace impl
}  // namespace pserver
