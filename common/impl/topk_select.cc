// TopK selection (for topk and topk_quantize): the k largest |u|; the
// contract is in topk_select.h.
// EXACT: a radix histogram on the top 16 key bits finds the bucket holding
// the k-th largest key; the exact threshold comes from that bucket alone.
// SAMPLED: threshold from the sample, then one filter pass.
#include "common/impl/topk_select.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "common/impl/codecs.h"

namespace pserver {
namespace impl {

namespace {
constexpr int kHistShift = 15;  // 31-bit keys -> 65536 buckets
constexpr size_t kBuckets = size_t{1} << (31 - kHistShift);
}  // namespace

// h0 and h1 are all zero between calls (each use clears what it counted);
// hist is fully rewritten by each call; low is cleared before use.
struct Histograms {
  std::vector<uint32_t> h0 = std::vector<uint32_t>(kBuckets, 0);
  std::vector<uint32_t> h1 = std::vector<uint32_t>(kBuckets, 0);
  std::vector<uint64_t> hist = std::vector<uint64_t>(kBuckets, 0);
  std::vector<uint64_t> low = std::vector<uint64_t>(size_t{1} << kHistShift);
};

TopKScratch::TopKScratch() = default;
TopKScratch::~TopKScratch() = default;

namespace {

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

absl::Status FirstNonFinite(absl::Span<const float> u) {
  for (size_t i = 0; i < u.size(); ++i) {
    if (!std::isfinite(u[i])) return NonFiniteInput(i, u[i]);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SelectExact(absl::Span<const float> u, uint64_t k,
                         TopKScratch* s, Selected* out) {
  const size_t n = u.size();
  const float* p = u.data();
  if (!s->hist) s->hist = std::make_unique<Histograms>();
  Histograms& tables = *s->hist;
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
  uint64_t* idx = nullptr;
  float* val = nullptr;
  if (bucket_lo > 0 && kept <= k + (uint64_t{1} << 20)) {
    // Usual case: one filter pass keeps every key of the bucket and above
    // (exactly `kept` of them), then the threshold is found among those.
    FilterCandidates(u, bucket_lo, kept, out);
    idx = out->idx.data();
    val = out->val.data();
    uint32_t* keys = s->keys.Reserve(in_bucket);
    size_t in = 0;
    for (size_t j = 0; j < kept; ++j) {
      uint32_t key = KeyOf(val[j]);
      if ((key >> kHistShift) == bucket) keys[in++] = key;
    }
    std::nth_element(keys, keys + (rank - 1), keys + in,
                     std::greater<uint32_t>());
    const uint32_t threshold = keys[rank - 1];
    uint64_t greater = above;
    for (size_t j = 0; j < in; ++j) greater += keys[j] > threshold;
    uint64_t take_equal = k - greater;
    size_t c = 0;
    for (size_t j = 0; j < kept; ++j) {
      uint32_t key = KeyOf(val[j]);
      if (key > threshold || (key == threshold && take_equal > 0)) {
        if (key == threshold) --take_equal;
        idx[c] = idx[j];
        val[c] = val[j];
        ++c;
      }
    }
    out->count = c;
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
  out->Reserve(k);
  idx = out->idx.data();
  val = out->val.data();
  size_t c = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t key = KeyOf(p[i]);
    if (key > threshold || (key == threshold && take_equal > 0)) {
      if (key == threshold) --take_equal;
      idx[c] = i;
      val[c] = p[i];
      ++c;
    }
  }
  out->count = c;
  return absl::OkStatus();
}

SamplePlan::SamplePlan(size_t n)
    : n(n),
      m(std::min<size_t>(n, std::max<size_t>(n / 1000, 16384))),
      stride(m == 0 ? 1 : n / m),
      key(internal::StreamKey(0x70b4)) {}

const uint64_t* SamplePositions(const SamplePlan& plan, TopKScratch* s) {
  if (s->positions_n != plan.n || s->positions.data() == nullptr) {
    uint64_t* pos = s->positions.Reserve(plan.m);
    for (size_t j = 0; j < plan.m; ++j) pos[j] = plan.Position(j);
    s->positions_n = plan.n;
  }
  return s->positions.data();
}

uint32_t SampleThreshold(const SamplePlan& plan, uint64_t want,
                         uint32_t* keys) {
  // Aim 3% above k: overshoot is refined exactly on the kept set, cheaply.
  const double r = std::ceil(static_cast<double>(want) * 1.03 *
                             static_cast<double>(plan.m) /
                             static_cast<double>(plan.n));
  const size_t rank = static_cast<size_t>(
      std::clamp<double>(r, 1.0, static_cast<double>(plan.m)));
  // The rank-th largest key: a histogram of the top 12 key bits finds its
  // bucket, then only that bucket's keys are ordered.
  constexpr int kShift = 19;  // 31-bit keys -> 4096 buckets
  uint32_t counts[uint32_t{1} << (31 - kShift)] = {};
  for (size_t j = 0; j < plan.m; ++j) ++counts[keys[j] >> kShift];
  uint32_t bucket = uint32_t{1} << (31 - kShift);
  size_t above = 0;
  while (bucket > 0) {
    --bucket;
    if (above + counts[bucket] >= rank) break;
    above += counts[bucket];
  }
  size_t in = 0;  // the bucket's keys, moved to the front
  for (size_t j = 0; j < plan.m; ++j) {
    if ((keys[j] >> kShift) == bucket) keys[in++] = keys[j];
  }
  const size_t inner = rank - above;  // 1-based, <= in
  std::nth_element(keys, keys + (inner - 1), keys + in,
                   std::greater<uint32_t>());
  return keys[inner - 1];
}

absl::Status JudgeCandidates(uint64_t k, TopKScratch* s,
                             SampledOutcome* outcome) {
  const size_t c = s->sel.count;
  if (c * 10 < k * 9) {
    *outcome = SampledOutcome::kFallBack;
    return absl::OkStatus();
  }
  // Non-finite keys exceed any finite threshold, so they are all kept, in
  // index order. CheckFinite names the candidate; report its element.
  absl::Status finite =
      s->sel.all_finite ? absl::OkStatus() : CheckFinite(s->sel.values());
  if (!finite.ok()) {
    const float* val = s->sel.val.data();
    size_t j = 0;
    while (std::isfinite(val[j])) ++j;
    return NonFiniteInput(s->sel.idx.data()[j], val[j]);
  }
  if (c * 10 <= k * 11) {
    *outcome = SampledOutcome::kDone;
    return absl::OkStatus();
  }
  *outcome = SampledOutcome::kRefined;
  return SelectExact(s->sel.values(), k, s, &s->refined);
}

void KeepRefined(TopKScratch* s) {
  // Ranks increase and rank j >= j, so the compaction runs in place.
  const uint64_t* rank = s->refined.idx.data();
  const float* kept = s->refined.val.data();
  uint64_t* idx = s->sel.idx.data();
  float* val = s->sel.val.data();
  for (size_t j = 0; j < s->refined.count; ++j) {
    idx[j] = idx[rank[j]];
    val[j] = kept[j];
  }
  s->sel.count = s->refined.count;
}

namespace {

absl::Status SelectSampled(absl::Span<const float> u, uint64_t k,
                           TopKScratch* s) {
  const SamplePlan plan(u.size());
  const uint64_t* pos = SamplePositions(plan, s);
  uint32_t* keys = s->sample.Reserve(plan.m);
  const float* p = u.data();
  // The sample is a gather across the whole tensor (a cache and TLB miss per
  // key): prefetch ahead so that the misses overlap.
  for (size_t j = 0; j < plan.m; ++j) {
    if (j + kSampleAhead < plan.m) __builtin_prefetch(p + pos[j + kSampleAhead]);
    keys[j] = KeyOf(p[pos[j]]);
  }
  const uint32_t threshold = SampleThreshold(plan, k, keys);
  if (threshold == 0 || threshold >= kInfKey) {
    return SelectExact(u, k, s, &s->sel);  // degenerate sample or bad input
  }
  const size_t cap = SampledCapacity(k);
  const size_t c = FilterCandidates(u, threshold, cap, &s->sel);
  if (c > cap) return SelectExact(u, k, s, &s->sel);
  s->sel.count = c;
  SampledOutcome outcome;
  absl::Status status = JudgeCandidates(k, s, &outcome);
  if (!status.ok()) return status;
  switch (outcome) {
    case SampledOutcome::kDone:
      return absl::OkStatus();
    case SampledOutcome::kRefined:
      KeepRefined(s);
      return absl::OkStatus();
    case SampledOutcome::kFallBack:
      break;
  }
  return SelectExact(u, k, s, &s->sel);
}

}  // namespace

absl::Status SelectTopK(absl::Span<const float> u, uint64_t k,
                        v1::TopKSelection selection, TopKScratch* s) {
  s->sel.count = 0;
  if (k == 0) return CheckFinite(u);
  if (k >= u.size()) {
    absl::Status status = CheckFinite(u);
    if (!status.ok()) return status;
    s->sel.Reserve(u.size());
    for (size_t i = 0; i < u.size(); ++i) s->sel.idx.data()[i] = i;
    if (!u.empty()) {
      std::memcpy(s->sel.val.data(), u.data(), u.size() * sizeof(float));
    }
    s->sel.count = u.size();
    return absl::OkStatus();
  }
  // Small tensors: a sample would be the whole tensor anyway.
  if (selection == v1::TOPK_SELECTION_EXACT ||
      u.size() < kMinSampledElements) {
    return SelectExact(u, k, s, &s->sel);
  }
  return SelectSampled(u, k, s);
}

}  // namespace impl
}  // namespace pserver
