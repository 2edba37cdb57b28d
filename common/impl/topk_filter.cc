// The filter pass of TopK selection (contract in topk_select.h): one read
// of u keeping the elements whose key reaches a threshold.
#include <immintrin.h>

#include <algorithm>

#include "common/impl/topk_select.h"
#include "common/internal/cpu.h"

namespace pserver {
namespace impl {
namespace {

// Appends i >= `from` with key(u_i) >= threshold to idx/val after the first
// c entries, one element at a time. Returns the new count, or cap + 1 as
// soon as it would exceed cap. *max_key: at least the largest key seen.
size_t FilterScalar(const float* u, size_t from, size_t n, uint32_t threshold,
                    uint64_t* idx, float* val, size_t c, size_t cap,
                    uint32_t* max_key) {
  for (size_t i = from; i < n; ++i) {
    const uint32_t key = KeyOf(u[i]);
    *max_key = std::max(*max_key, key);
    if (key >= threshold) {
      if (c == cap) return cap + 1;
      idx[c] = i;
      val[c] = u[i];
      ++c;
    }
  }
  return c;
}

#if defined(__x86_64__)
#define PSERVER_AVX2_BMI __attribute__((target("avx2,fma,bmi,popcnt")))

// Bit j: key(u[j]) > tm1 for the 8 elements at u; *vmax: lane-wise maximum
// of the keys.
PSERVER_AVX2_BMI inline __attribute__((always_inline)) uint32_t Above8(
    const float* u, __m256i absmask, __m256i tm1, __m256i* vmax) {
  __m256i k = _mm256_and_si256(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u)), absmask);
  *vmax = _mm256_max_epu32(*vmax, k);
  return static_cast<uint32_t>(
      _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(k, tm1))));
}

// As FilterScalar from 0, 32 elements per step. A mispredicted branch per
// kept element would cost more than the memory stream (k is about 1% of n):
// the first two hits of each group are written unconditionally (into the
// kFilterSlack room when there are fewer), and only groups with three or
// more hits take a branch. REQUIRES: threshold >= 1.
PSERVER_AVX2_BMI size_t FilterAvx2(const float* u, size_t n,
                                   uint32_t threshold, uint64_t* idx,
                                   float* val, size_t cap,
                                   uint32_t* max_key) {
  // Keys are non-negative int32, so a signed compare against T - 1 works.
  const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
  const __m256i tm1 = _mm256_set1_epi32(static_cast<int>(threshold - 1));
  __m256i vmax = _mm256_setzero_si256();
  size_t c = 0, i = 0;
  for (; i + 32 <= n; i += 32) {
    // Two lines ahead. Past the end is harmless (prefetches do not fault);
    // the address is formed as an integer, as pointer arithmetic beyond the
    // array would be undefined.
    const uintptr_t ahead =
        reinterpret_cast<uintptr_t>(u + i) + kStreamAhead * sizeof(float);
    _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(ahead + 64), _MM_HINT_T0);
    const uint32_t m = Above8(u + i, absmask, tm1, &vmax) |
                       Above8(u + i + 8, absmask, tm1, &vmax) << 8 |
                       Above8(u + i + 16, absmask, tm1, &vmax) << 16 |
                       Above8(u + i + 24, absmask, tm1, &vmax) << 24;
    uint32_t w = m;
    const uint32_t j0 = _tzcnt_u32(w) & 31;  // 32 (no hit) reads u[i]
    idx[c] = i + j0;
    val[c] = u[i + j0];
    w = _blsr_u32(w);
    const uint32_t j1 = _tzcnt_u32(w) & 31;
    idx[c + 1] = i + j1;
    val[c + 1] = u[i + j1];
    w = _blsr_u32(w);
    const uint32_t hits = static_cast<uint32_t>(_mm_popcnt_u32(m));
    if (hits > 2) {
      for (size_t q = c + 2; w != 0; ++q, w = _blsr_u32(w)) {
        const uint32_t j = _tzcnt_u32(w);
        idx[q] = i + j;
        val[q] = u[i + j];
      }
    }
    c += hits;
    if (c > cap) return cap + 1;
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), vmax);
  *max_key = *std::max_element(lanes, lanes + 8);
  return FilterScalar(u, i, n, threshold, idx, val, c, cap, max_key);
}
#endif

}  // namespace

size_t FilterCandidates(absl::Span<const float> u, uint32_t threshold,
                        size_t cap, Selected* out) {
  out->Reserve(cap);
  uint32_t max_key = 0;
  size_t c;
#if defined(__x86_64__)
  if (internal::UseAvx2()) {
    c = FilterAvx2(u.data(), u.size(), threshold, out->idx.data(),
                   out->val.data(), cap, &max_key);
  } else  // NOLINT(readability/braces)
#endif
  {
    c = FilterScalar(u.data(), 0, u.size(), threshold, out->idx.data(),
                     out->val.data(), 0, cap, &max_key);
  }
  out->all_finite = max_key < kInfKey;
  if (c <= cap) out->count = c;
  return c;
}


}  // namespace impl
}  // namespace pserver
