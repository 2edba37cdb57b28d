// TopK selection (for topk and topk_quantize): the k largest |u|.
//
// Selection works on key(i) = float bits of |u_i|, whose unsigned order is
// the order of |u| (NaN and Inf sort above every finite value, which is how
// non-finite input is caught without an extra pass).
// EXACT: a radix histogram on the top 16 key bits finds the bucket holding
// the k-th largest key; the exact threshold comes from that bucket alone.
// SAMPLED: the threshold is the matching order statistic of a deterministic
// sample; one filter pass keeps key >= threshold. If that keeps more than
// 1.1 k (and the buffer held them), exact selection runs on the kept
// elements only, which yields exactly the EXACT answer; fewer than 0.9 k, or
// a full buffer, falls back to EXACT on everything.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/impl/codecs.h"
#include "common/internal/cpu.h"
#include "common/internal/float16.h"
#include "common/internal/rng.h"

namespace pserver {
namespace impl {
namespace {

constexpr uint32_t kInfKey = 0x7f800000;
constexpr int kHistShift = 15;  // 31-bit keys -> 65536 buckets
constexpr size_t kBuckets = size_t{1} << (31 - kHistShift);

// Histogram tables reused by every SelectExact call on a thread: allocating
// and zero-filling them (about 1 MiB) per call showed up in review. h0 and h1
// are all zero between calls (each use clears what it counted); hist is
// fully rewritten by each call; low is cleared before use.
struct Histograms {
  std::vector<uint32_t> h0 = std::vector<uint32_t>(kBuckets, 0);
  std::vector<uint32_t> h1 = std::vector<uint32_t>(kBuckets, 0);
  std::vector<uint64_t> hist = std::vector<uint64_t>(kBuckets, 0);
  std::vector<uint64_t> low = std::vector<uint64_t>(size_t{1} << kHistShift);
};

Histograms& ThreadHistograms() {
  thread_local Histograms h;
  return h;
}

// hist = (keep ? hist : 0) + h0 + h1, leaving h0 and h1 zero.
void DrainCounts(Histograms* h, bool keep) {
  uint32_t* h0 = h->h0.data();
  uint32_t* h1 = h->h1.data();
  uint64_t* hist = h->hist.data();
  for (size_t b = 0; b < kBuckets; ++b) {
    hist[b] = (keep ? hist[b] : 0) + uint64_t{h0[b]} + h1[b];
    h0[b] = h1[b] = 0;
  }
}

inline uint32_t KeyOf(float f) { return internal::FloatBits(f) & 0x7fffffff; }

absl::Status FirstNonFinite(absl::Span<const float> u) {
  for (size_t i = 0; i < u.size(); ++i) {
    if (!std::isfinite(u[i])) return NonFiniteInput(i, u[i]);
  }
  return absl::OkStatus();
}

// Keeps i with key(u_i) >= threshold into idx/val (capacity `cap`).
// Returns the count, or cap + 1 if it would not fit.
size_t FilterScalar(const float* u, size_t n, uint32_t threshold,
                    uint64_t* idx, float* val, size_t cap) {
  size_t c = 0;
  for (size_t i = 0; i < n; ++i) {
    if (KeyOf(u[i]) >= threshold) {
      if (c == cap) return cap + 1;
      idx[c] = i;
      val[c] = u[i];
      ++c;
    }
  }
  return c;
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) size_t FilterAvx2(
    const float* u, size_t n, uint32_t threshold, uint64_t* idx, float* val,
    size_t cap) {
  // Keys are non-negative int32, so a signed compare against T - 1 works;
  // threshold >= 1 here.
  const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
  const __m256i tm1 = _mm256_set1_epi32(static_cast<int>(threshold - 1));
  size_t c = 0, i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i k0 = _mm256_and_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + i)), absmask);
    __m256i k1 = _mm256_and_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + i + 8)),
        absmask);
    uint32_t m = static_cast<uint32_t>(
        _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(k0, tm1))));
    m |= static_cast<uint32_t>(_mm256_movemask_ps(
             _mm256_castsi256_ps(_mm256_cmpgt_epi32(k1, tm1))))
         << 8;
    if (m) {
      if (c + 16 > cap) return cap + 1;
      do {
        unsigned j = static_cast<unsigned>(__builtin_ctz(m));
        idx[c] = i + j;
        val[c] = u[i + j];
        ++c;
        m &= m - 1;
      } while (m);
    }
  }
  for (; i < n; ++i) {
    if (KeyOf(u[i]) >= threshold) {
      if (c == cap) return cap + 1;
      idx[c] = i;
      val[c] = u[i];
      ++c;
    }
  }
  return c;
}
#endif

size_t Filter(const float* u, size_t n, uint32_t threshold, uint64_t* idx,
              float* val, size_t cap) {
#if defined(__x86_64__)
  if (internal::UseAvx2()) return FilterAvx2(u, n, threshold, idx, val, cap);
#endif
  return FilterScalar(u, n, threshold, idx, val, cap);
}

// The k largest keys (ties: lower index), k >= 1, k <= u.size().
absl::Status SelectExact(absl::Span<const float> u, uint64_t k,
                         std::vector<uint64_t>* idx, std::vector<float>* val) {
  const size_t n = u.size();
  const float* p = u.data();
  Histograms& tables = ThreadHistograms();
  const std::vector<uint64_t>& hist = tables.hist;
  {
    // Two interleaved tables halve store-to-load stalls on repeated buckets.
    uint32_t* h0 = tables.h0.data();
    uint32_t* h1 = tables.h1.data();
    bool drained = false;
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
      ++h0[KeyOf(p[i]) >> kHistShift];
      ++h1[KeyOf(p[i + 1]) >> kHistShift];
      if ((i & 0x3fffffff) == 0x3ffffffe) {  // drain before uint32 overflow
        DrainCounts(&tables, drained);
        drained = true;
      }
    }
    if (i < n) ++h0[KeyOf(p[i]) >> kHistShift];
    DrainCounts(&tables, drained);
  }
  for (size_t b = kInfKey >> kHistShift; b < kBuckets; ++b) {
    if (hist[b]) return FirstNonFinite(u);
  }
  // Bucket of the k-th largest key, and how many keys lie above it.
  size_t bucket = kBuckets;
  uint64_t above = 0;
  while (bucket > 0) {
    --bucket;
    if (above + hist[bucket] >= k) break;
    above += hist[bucket];
  }
  const uint64_t in_bucket = hist[bucket];
  const uint64_t rank = k - above;  // 1-based rank inside the bucket
  const uint32_t bucket_lo = static_cast<uint32_t>(bucket << kHistShift);
  const uint64_t kept = above + in_bucket;
  if (bucket_lo > 0 && kept <= k + (uint64_t{1} << 20)) {
    // Usual case: one filter pass keeps every key of the bucket and above
    // (exactly `kept` of them), then the threshold is found among those.
    // The AVX2 filter wants 16 spare slots; it then keeps exactly `kept`.
    idx->resize(kept + 16);
    val->resize(kept + 16);
    size_t c = Filter(p, n, bucket_lo, idx->data(), val->data(), kept + 16);
    idx->resize(c);
    val->resize(c);
    std::vector<uint32_t> keys;
    keys.reserve(in_bucket);
    for (size_t j = 0; j < kept; ++j) {
      uint32_t key = KeyOf((*val)[j]);
      if ((key >> kHistShift) == bucket) keys.push_back(key);
    }
    std::nth_element(keys.begin(), keys.begin() + (rank - 1), keys.end(),
                     std::greater<uint32_t>());
    const uint32_t threshold = keys[rank - 1];
    uint64_t greater = above;
    for (uint32_t key : keys) greater += key > threshold;
    uint64_t take_equal = k - greater;
    size_t out = 0;
    for (size_t j = 0; j < kept; ++j) {
      uint32_t key = KeyOf((*val)[j]);
      if (key > threshold || (key == threshold && take_equal > 0)) {
        if (key == threshold) --take_equal;
        (*idx)[out] = (*idx)[j];
        (*val)[out] = (*val)[j];
        ++out;
      }
    }
    idx->resize(out);
    val->resize(out);
    return absl::OkStatus();
  }
  // Huge bucket (e.g. mostly zeros): second histogram on the low key bits
  // of that bucket gives the exact threshold.
  std::vector<uint64_t>& low = tables.low;
  std::fill(low.begin(), low.end(), 0);
  const uint32_t mask = (uint32_t{1} << kHistShift) - 1;
  for (size_t i = 0; i < n; ++i) {
    uint32_t key = KeyOf(p[i]);
    if ((key >> kHistShift) == bucket) ++low[key & mask];
  }
  size_t j = low.size();
  uint64_t cum = 0;
  while (j > 0) {
    --j;
    if (cum + low[j] >= rank) break;
    cum += low[j];
  }
  const uint32_t threshold = bucket_lo | static_cast<uint32_t>(j);
  uint64_t take_equal = k - above - cum;
  idx->clear();
  val->clear();
  idx->reserve(k);
  val->reserve(k);
  for (size_t i = 0; i < n; ++i) {
    uint32_t key = KeyOf(p[i]);
    if (key > threshold || (key == threshold && take_equal > 0)) {
      if (key == threshold) --take_equal;
      idx->push_back(i);
      val->push_back(p[i]);
    }
  }
  return absl::OkStatus();
}

// Threshold key from a deterministic sample: about `want` of n keys are >=
// it. The sample positions depend only on n.
uint32_t SampleThreshold(absl::Span<const float> u, uint64_t want) {
  const size_t n = u.size();
  const size_t m = std::min<size_t>(n, std::max<size_t>(n / 1000, 16384));
  const size_t stride = n / m;
  const uint64_t key = internal::StreamKey(0x70b4);
  std::vector<uint32_t> sample(m);
  for (size_t j = 0; j < m; ++j) {
    size_t pos = j * stride + internal::Below(internal::Draw(key, j), stride);
    sample[j] = KeyOf(u[pos]);
  }
  // Aim 3% above k: overshoot is refined exactly on the kept set, cheaply.
  double r = std::ceil(static_cast<double>(want) * 1.03 * m / n);
  size_t rank = static_cast<size_t>(std::clamp<double>(r, 1.0, m));
  std::nth_element(sample.begin(), sample.begin() + (rank - 1), sample.end(),
                   std::greater<uint32_t>());
  return sample[rank - 1];
}

absl::Status SelectSampled(absl::Span<const float> u, uint64_t k,
                           std::vector<uint64_t>* idx,
                           std::vector<float>* val) {
  const size_t n = u.size();
  uint32_t threshold = SampleThreshold(u, k);
  if (threshold == 0 || threshold >= kInfKey) {
    return SelectExact(u, k, idx, val);  // degenerate sample or bad input
  }
  const size_t cap = k + k / 2 + 64;
  idx->resize(cap);
  val->resize(cap);
  size_t c = Filter(u.data(), n, threshold, idx->data(), val->data(), cap);
  if (c > cap || c * 10 < k * 9) return SelectExact(u, k, idx, val);
  idx->resize(c);
  val->resize(c);
  // Non-finite keys exceed any finite threshold, so they are all kept here,
  // in index order.
  for (size_t j = 0; j < c; ++j) {
    if (!std::isfinite((*val)[j])) return NonFiniteInput((*idx)[j], (*val)[j]);
  }
  if (c * 10 > k * 11) {
    std::vector<uint64_t> pos;
    std::vector<float> kept;
    absl::Status s = SelectExact(*val, k, &pos, &kept);
    if (!s.ok()) return s;
    for (size_t j = 0; j < pos.size(); ++j) (*idx)[j] = (*idx)[pos[j]];
    idx->resize(pos.size());
    *val = std::move(kept);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SelectTopK(absl::Span<const float> u, uint64_t k,
                        v1::TopKSelection selection,
                        std::vector<uint64_t>* idx, std::vector<float>* val) {
  idx->clear();
  val->clear();
  if (k == 0) return CheckFinite(u);
  if (k >= u.size()) {
    absl::Status s = CheckFinite(u);
    if (!s.ok()) return s;
    for (size_t i = 0; i < u.size(); ++i) idx->push_back(i);
    val->assign(u.begin(), u.end());
    return absl::OkStatus();
  }
  // Small tensors: a sample would be the whole tensor anyway.
  if (selection == v1::TOPK_SELECTION_EXACT || u.size() < (size_t{1} << 16)) {
    return SelectExact(u, k, idx, val);
  }
  return SelectSampled(u, k, idx, val);
}

}  // namespace impl
}  // namespace pserver
