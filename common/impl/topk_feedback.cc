// TopK with error feedback in one pass over memory (contract in
// topk_select.h). The generic algorithm reads g and e_in and writes u, reads
// u to select, and writes the residuals of the selected elements. Here the
// sample is taken from g and e_in directly, and one streaming pass forms u,
// writes e_out and keeps the candidates. With fp32 values a candidate's
// residual is u - u = +0, written in the same pass, so in the usual case
// (0.9 k <= candidates <= 1.1 k) nothing is touched twice; otherwise the
// candidates' residuals are restored to u and the generic steps follow.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "common/impl/codecs.h"
#include "common/impl/topk_select.h"
#include "common/internal/cpu.h"
#include "common/internal/float16.h"

namespace pserver {
namespace impl {
namespace {

// Residuals of a call at least this large (bytes) are written with
// non-temporal stores (as in onebit_kernels.cc: no read-for-ownership of
// e_out lines that are only written).
constexpr uint64_t kStreamBytes = uint64_t{16} << 20;

inline float InputAt(const float* g, const float* e_in, float decay,
                     size_t i) {
  float d = decay * e_in[i];
  return g[i] + d;
}

void FormInput(const float* g, const float* e_in, float decay, float* u,
               size_t from, size_t n) {
  for (size_t i = from; i < n; ++i) u[i] = InputAt(g, e_in, decay, i);
}

// e_out[i] = u_i - decode(u_i) for the selected elements, whose e_out holds
// u_i: what decoding the payload with alpha = -1 adds (u + (-d) == u - d).
void ApplyResiduals(const Selected& sel, v1::ValueFormat f, float* e_out) {
  const uint64_t* idx = sel.idx.data();
  const float* val = sel.val.data();
  for (size_t j = 0; j < sel.count; ++j) {
    const float v = val[j];
    const float d = f == v1::VALUE_FORMAT_FP16
                        ? internal::HalfToFloat(internal::FloatToHalf(v))
                        : v;
    e_out[idx[j]] = v - d;
  }
}

// Puts u back into e_out for the first `count` candidates (zeroed by a
// kZero filter pass).
void RestoreCandidates(const Selected& sel, size_t count, float* e_out) {
  for (size_t j = 0; j < count; ++j) {
    e_out[sel.idx.data()[j]] = sel.val.data()[j];
  }
}

// The filter pass from element `from` on, one element at a time: e_out = u
// (or +0 for a recorded candidate when kZero); candidates key(u) >= threshold
// are recorded while the count is at most cap (so cap + 1 recorded means
// "too many"), later ones only get e_out = u. Returns the recorded count.
// *max_key: at least the largest key seen.
template <bool kZero>
size_t FilterFeedbackScalar(const float* g, const float* e_in, float decay,
                            float* e_out, size_t from, size_t n,
                            uint32_t threshold, uint64_t* idx, float* val,
                            size_t c, size_t cap, uint32_t* max_key) {
  for (size_t i = from; i < n; ++i) {
    const float u = InputAt(g, e_in, decay, i);
    const uint32_t key = KeyOf(u);
    *max_key = std::max(*max_key, key);
    if (key >= threshold && c <= cap) {
      idx[c] = i;
      val[c] = u;
      ++c;
      e_out[i] = kZero ? 0.0f : u;
    } else {
      e_out[i] = u;
    }
  }
  return c;
}

#if defined(__x86_64__)
#define PSERVER_AVX2_BMI __attribute__((target("avx2,fma,bmi,popcnt")))

// u for 8 elements at i into e_out (+0 where a candidate, when kZero);
// returns the candidate bits. *vmax: lane-wise maximum of the keys.
template <bool kZero, bool kStream>
PSERVER_AVX2_BMI inline __attribute__((always_inline)) uint32_t Feed8(
    const float* g, const float* e_in, float* e_out, size_t i, __m256 vdecay,
    __m256i absmask, __m256i tm1, __m256i* vmax) {
  const __m256 u = _mm256_add_ps(
      _mm256_loadu_ps(g + i), _mm256_mul_ps(vdecay, _mm256_loadu_ps(e_in + i)));
  const __m256i key = _mm256_and_si256(_mm256_castps_si256(u), absmask);
  *vmax = _mm256_max_epu32(*vmax, key);
  const __m256i hit = _mm256_cmpgt_epi32(key, tm1);
  const __m256 r = kZero ? _mm256_andnot_ps(_mm256_castsi256_ps(hit), u) : u;
  if (kStream) {
    _mm_stream_ps(e_out + i, _mm256_castps256_ps128(r));
    _mm_stream_ps(e_out + i + 4, _mm256_extractf128_ps(r, 1));
  } else {
    _mm256_storeu_ps(e_out + i, r);
  }
  return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(hit)));
}

// As FilterFeedbackScalar from 0, 32 elements per step, with the branch-free
// recording of topk_select.cc's FilterAvx2 (a candidate's value is formed
// again from g and e_in, still in L1, with the same two roundings). After the
// step that passes cap, the rest is finished without recording.
// REQUIRES: threshold >= 1; kStream: e_out is 16-byte aligned.
template <bool kZero, bool kStream>
PSERVER_AVX2_BMI size_t FilterFeedbackAvx2(const float* g, const float* e_in,
                                           float decay, float* e_out,
                                           size_t n, uint32_t threshold,
                                           uint64_t* idx, float* val,
                                           size_t cap, uint32_t* max_key) {
  const __m256 vdecay = _mm256_set1_ps(decay);
  __m256i vmax = _mm256_setzero_si256();
  const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
  const __m256i tm1 = _mm256_set1_epi32(static_cast<int>(threshold - 1));
  size_t c = 0, i = 0;
  for (; i + 32 <= n; i += 32) {
    const uint32_t m =
        Feed8<kZero, kStream>(g, e_in, e_out, i, vdecay, absmask, tm1, &vmax) |
        Feed8<kZero, kStream>(g, e_in, e_out, i + 8, vdecay, absmask, tm1,
                              &vmax)
            << 8 |
        Feed8<kZero, kStream>(g, e_in, e_out, i + 16, vdecay, absmask, tm1,
                              &vmax)
            << 16 |
        Feed8<kZero, kStream>(g, e_in, e_out, i + 24, vdecay, absmask, tm1,
                              &vmax)
            << 24;
    uint32_t w = m;
    const uint32_t j0 = _tzcnt_u32(w) & 31;
    idx[c] = i + j0;
    val[c] = InputAt(g, e_in, decay, i + j0);
    w = _blsr_u32(w);
    const uint32_t j1 = _tzcnt_u32(w) & 31;
    idx[c + 1] = i + j1;
    val[c + 1] = InputAt(g, e_in, decay, i + j1);
    w = _blsr_u32(w);
    const uint32_t hits = static_cast<uint32_t>(_mm_popcnt_u32(m));
    if (hits > 2) {
      for (size_t q = c + 2; w != 0; ++q, w = _blsr_u32(w)) {
        const uint32_t j = _tzcnt_u32(w);
        idx[q] = i + j;
        val[q] = InputAt(g, e_in, decay, i + j);
      }
    }
    c += hits;
    if (c > cap) {  // too many: the caller does not look at max_key
      i += 32;
      FormInput(g, e_in, decay, e_out, i, n);
      i = n;
      break;
    }
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), vmax);
  *max_key = *std::max_element(lanes, lanes + 8);
  c = FilterFeedbackScalar<kZero>(g, e_in, decay, e_out, i, n, threshold, idx,
                                  val, c, cap, max_key);
  // Non-temporal stores are weakly ordered: fence them before whoever
  // synchronises with this thread reads e_out.
  if (kStream) _mm_sfence();
  return c;
}
#endif

// The filter pass into *out (count recorded as the pass returns it).
size_t FilterFeedback(const float* g, const float* e_in, float decay,
                      float* e_out, size_t n, uint32_t threshold, size_t cap,
                      bool zero, Selected* out) {
  out->Reserve(cap + 1);
  uint64_t* idx = out->idx.data();
  float* val = out->val.data();
  uint32_t max_key = 0;
  size_t c;
#if defined(__x86_64__)
  if (internal::UseAvx2()) {
    const bool stream = zero && n * sizeof(float) >= kStreamBytes &&
                        reinterpret_cast<uintptr_t>(e_out) % 16 == 0;
    if (stream) {
      c = FilterFeedbackAvx2<true, true>(g, e_in, decay, e_out, n, threshold,
                                         idx, val, cap, &max_key);
    } else if (zero) {
      c = FilterFeedbackAvx2<true, false>(g, e_in, decay, e_out, n, threshold,
                                          idx, val, cap, &max_key);
    } else {
      c = FilterFeedbackAvx2<false, false>(g, e_in, decay, e_out, n,
                                           threshold, idx, val, cap, &max_key);
    }
  } else  // NOLINT(readability/braces)
#endif
  {
    c = zero ? FilterFeedbackScalar<true>(g, e_in, decay, e_out, 0, n,
                                          threshold, idx, val, 0, cap, &max_key)
             : FilterFeedbackScalar<false>(g, e_in, decay, e_out, 0, n,
                                           threshold, idx, val, 0, cap,
                                           &max_key);
  }
  out->all_finite = max_key < kInfKey;
  return c;
}

// The generic steps on u, which e_out holds: select, then residuals.
absl::Status SelectOnInput(absl::Span<float> e_out, uint64_t k,
                           v1::TopKSelection selection, v1::ValueFormat f,
                           TopKScratch* s) {
  absl::Status status = SelectTopK(e_out, k, selection, s);
  if (!status.ok()) return status;
  ApplyResiduals(s->sel, f, e_out.data());
  return absl::OkStatus();
}

// As SelectOnInput for the EXACT fallbacks of SAMPLED selection.
absl::Status SelectExactOnInput(absl::Span<float> e_out, uint64_t k,
                                v1::ValueFormat f, TopKScratch* s) {
  absl::Status status = SelectExact(e_out, k, s, &s->sel);
  if (!status.ok()) return status;
  ApplyResiduals(s->sel, f, e_out.data());
  return absl::OkStatus();
}

}  // namespace

absl::Status SelectWithFeedback(absl::Span<const float> g,
                                absl::Span<const float> e_in, float decay,
                                uint64_t k, v1::TopKSelection selection,
                                v1::ValueFormat f, absl::Span<float> e_out,
                                TopKScratch* s) {
  const size_t n = g.size();
  const float* gp = g.data();
  const float* ep = e_in.data();
  float* out = e_out.data();
  // As SelectTopK decides: SAMPLED only for 1 <= k < n and large tensors.
  if (selection == v1::TOPK_SELECTION_EXACT || n < kMinSampledElements ||
      k == 0 || k >= n) {
    FormInput(gp, ep, decay, out, 0, n);
    return SelectOnInput(e_out, k, selection, f, s);
  }
  // The sample of u, formed where it is read (prefetched a few ahead: each
  // key is a cache and TLB miss in g and in e_in).
  const SamplePlan plan(n);
  const uint64_t* pos = SamplePositions(plan, s);
  uint32_t* keys = s->sample.Reserve(plan.m);
  for (size_t j = 0; j < plan.m; ++j) {
    if (j + kSampleAhead < plan.m) {
      __builtin_prefetch(gp + pos[j + kSampleAhead]);
      __builtin_prefetch(ep + pos[j + kSampleAhead]);
    }
    keys[j] = KeyOf(InputAt(gp, ep, decay, pos[j]));
  }
  const uint32_t threshold = SampleThreshold(plan, k, keys);
  if (threshold == 0 || threshold >= kInfKey) {
    // Degenerate sample or bad input: SelectTopK would go EXACT.
    FormInput(gp, ep, decay, out, 0, n);
    return SelectExactOnInput(e_out, k, f, s);
  }
  const size_t cap = SampledCapacity(k);
  // fp32 values decode to u exactly: a candidate's residual is +0 unless it
  // is dropped later (then restored to u).
  const bool zero = f != v1::VALUE_FORMAT_FP16;
  const size_t c =
      FilterFeedback(gp, ep, decay, out, n, threshold, cap, zero, &s->sel);
  s->sel.count = c;
  if (c > cap) {
    if (zero) RestoreCandidates(s->sel, c, out);
    return SelectExactOnInput(e_out, k, f, s);
  }
  SampledOutcome outcome;
  absl::Status status = JudgeCandidates(k, s, &outcome);
  if (!status.ok()) return status;
  switch (outcome) {
    case SampledOutcome::kDone:
      break;
    case SampledOutcome::kRefined:
      if (zero) {
        // Restore the candidates the exact refinement dropped.
        const uint64_t* rank = s->refined.idx.data();
        size_t r = 0;
        for (size_t j = 0; j < c; ++j) {
          if (r < s->refined.count && rank[r] == j) {
            ++r;
          } else {
            out[s->sel.idx.data()[j]] = s->sel.val.data()[j];
          }
        }
      }
      KeepRefined(s);
      break;
    case SampledOutcome::kFallBack:
      if (zero) RestoreCandidates(s->sel, c, out);
      return SelectExactOnInput(e_out, k, f, s);
  }
  if (!zero) ApplyResiduals(s->sel, f, out);
  return absl::OkStatus();
}

}  // namespace impl
}  // namespace pserver
