// TopK sparsification (Aji & Heafield 2017; Lin et al. 2018): keep the k
// largest |u|. Payload: varint count, varint index gaps, values.
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
#include "common/internal/varint.h"

namespace pserver {
namespace impl {
namespace {

constexpr uint32_t kInfKey = 0x7f800000;
constexpr int kHistShift = 15;  // 31-bit keys -> 65536 buckets
constexpr size_t kBuckets = size_t{1} << (31 - kHistShift);

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
  std::vector<uint64_t> hist(kBuckets, 0);
  {
    // Two interleaved tables halve store-to-load stalls on repeated buckets.
    std::vector<uint32_t> h0(kBuckets, 0), h1(kBuckets, 0);
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
      ++h0[KeyOf(p[i]) >> kHistShift];
      ++h1[KeyOf(p[i + 1]) >> kHistShift];
      if ((i & 0x3fffffff) == 0x3ffffffe) {  // flush before uint32 overflow
        for (size_t b = 0; b < kBuckets; ++b) hist[b] += h0[b] + h1[b], h0[b] = h1[b] = 0;
      }
    }
    if (i < n) ++h0[KeyOf(p[i]) >> kHistShift];
    for (size_t b = 0; b < kBuckets; ++b) hist[b] += uint64_t{h0[b]} + h1[b];
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
  std::vector<uint64_t> low(size_t{1} << kHistShift, 0);
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

class TopKCodec final : public CodecBase {
 public:
  explicit TopKCodec(const v1::CodecParams& params)
      : CodecBase(v1::CODEC_TOPK, params) {}

  absl::Status Encode(absl::Span<const float> u, uint64_t seed,
                      v1::EncodedTensor* out) const override {
    std::vector<uint64_t> idx;
    std::vector<float> val;
    uint64_t k = ResolveK(params(), u.size());
    absl::Status s = SelectTopK(u, k, params().selection(), &idx, &val);
    if (!s.ok()) return s;
    StartOutput(u.size(), out);
    out->mutable_params()->set_k(k);
    std::string* payload = out->mutable_payload();
    payload->reserve(idx.size() * 8 + 10);
    AppendIndices(idx, payload);
    AppendValues(val, params().value_format(), payload);
    return absl::OkStatus();
  }

  absl::Status Validate(const v1::EncodedTensor& t,
                        uint64_t n) const override {
    absl::Status s = CheckHeader(t, n);
    if (!s.ok()) return s;
    s = CheckValueFormat(t.params());
    if (!s.ok()) return s;
    uint64_t count;
    size_t offset;
    s = ParseIndices(t.payload(), n, &count, nullptr, &offset);
    if (!s.ok()) return s;
    const v1::ValueFormat f = t.params().value_format();
    const size_t rest = t.payload().size() - offset;
    if (rest / ValueBytes(f) != count || rest % ValueBytes(f) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "payload has ", rest, " value bytes after the indices; expected ",
          count * ValueBytes(f), " for ", count, " topk values"));
    }
    return CheckValues(
        reinterpret_cast<const uint8_t*>(t.payload().data()) + offset, count,
        f, "topk");
  }

 protected:
  void AccumulateValid(const v1::EncodedTensor& t, float alpha,
                       absl::Span<float> acc) const override {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(t.payload().data());
    const uint8_t* end = p + t.payload().size();
    uint64_t count = 0;
    internal::GetVarint(&p, end, &count);
    const v1::ValueFormat f = t.params().value_format();
    const size_t w = ValueBytes(f);
    const uint8_t* values = end - count * w;
    uint64_t index = 0;
    for (uint64_t j = 0; j < count; ++j) {
      uint64_t gap = 0;
      internal::GetVarint(&p, values, &gap);
      index = j == 0 ? gap : index + gap + 1;
      acc[index] += alpha * LoadValue(values + j * w, f);
    }
  }
};

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

void AppendIndices(absl::Span<const uint64_t> idx, std::string* out) {
  size_t old = out->size();
  out->resize(old + (idx.size() + 1) * internal::kMaxVarintBytes);
  uint8_t* start = reinterpret_cast<uint8_t*>(&(*out)[0]);
  uint8_t* p = internal::PutVarint(idx.size(), start + old);
  for (size_t j = 0; j < idx.size(); ++j) {
    p = internal::PutVarint(j == 0 ? idx[0] : idx[j] - idx[j - 1] - 1, p);
  }
  out->resize(static_cast<size_t>(p - start));
}

absl::Status ParseIndices(absl::string_view payload, uint64_t n,
                          uint64_t* count, std::vector<uint64_t>* idx,
                          size_t* values_offset) {
  const uint8_t* begin = reinterpret_cast<const uint8_t*>(payload.data());
  const uint8_t* p = begin;
  const uint8_t* end = p + payload.size();
  internal::VarintResult r = internal::GetVarint(&p, end, count);
  if (r != internal::VarintResult::kOk) {
    return absl::InvalidArgumentError(absl::StrCat(
        "payload count varint is ",
        r == internal::VarintResult::kTruncated ? "truncated" : "over 64 bits",
        "; expected a varint count <= ", n));
  }
  if (*count > n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "payload count is ", *count, "; expected at most ", n, " (num_elements)"));
  }
  // Each gap takes at least one byte: bound the count before allocating.
  if (*count > payload.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "payload count is ", *count, " but the payload is only ",
        payload.size(), " bytes; expected at least one byte per index"));
  }
  if (idx) idx->reserve(*count);
  uint64_t index = 0;
  for (uint64_t j = 0; j < *count; ++j) {
    uint64_t gap;
    r = internal::GetVarint(&p, end, &gap);
    if (r != internal::VarintResult::kOk) {
      return absl::InvalidArgumentError(absl::StrCat(
          "index gap ", j, " is ",
          r == internal::VarintResult::kTruncated ? "truncated" : "over 64 bits",
          "; expected a varint"));
    }
    // index + gap + 1 < n, written so that nothing overflows.
    if (j == 0 ? gap >= n : (gap >= n || index >= n - 1 - gap)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "index ", j, " (gap ", gap, " after ", j == 0 ? 0 : index,
          ") is out of range; expected increasing indices below ", n));
    }
    index = j == 0 ? gap : index + gap + 1;
    if (idx) idx->push_back(index);
  }
  *values_offset = static_cast<size_t>(p - begin);
  return absl::OkStatus();
}

std::unique_ptr<Codec> NewTopKCodec(const v1::CodecParams& params) {
  return std::make_unique<TopKCodec>(params);
}

}  // namespace impl
}  // namespace pserver
